"""Sampling parameters on the wire: the engine's `SamplingParams`, validated from JSON.

The class and its ranges are defined once, in `inflight.engine.sampling_params`; here is
only what the wire adds: a single `stop` string is taken as a list, and the
`schema_version` that older producers sent inside `params` is accepted (1) and dropped.
Use `WireSamplingParams` as a field type in wire models.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field

from inflight.engine.sampling_params import (MAX_LOGPROBS, MAX_STOP_CHARS, MAX_STOP_STRINGS,
                                             MAX_STOP_TOKEN_IDS, MAX_TOKEN_ID, MAX_TOKENS_LIMIT,
                                             SEED_MAX, SamplingParams, SamplingParamsError,
                                             StructuredOutputs, StructuredOutputsError)
from inflight.schemas.base import SCHEMA_VERSION

__all__ = ["MAX_LOGPROBS", "MAX_STOP_CHARS", "MAX_STOP_STRINGS", "MAX_STOP_TOKEN_IDS",
           "MAX_TOKENS_LIMIT", "SEED_MAX", "SamplingParams", "SamplingParamsError",
           "StructuredOutputs", "StructuredOutputsError", "TokenId", "WireSamplingParams"]

TokenId = Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]


def _from_wire(value: Any) -> Any:
    if isinstance(value, dict):
        value = dict(value)
        if value.get("schema_version", SCHEMA_VERSION) == SCHEMA_VERSION:
            value.pop("schema_version", None)
        stop = value.get("stop")
        if stop is None and "stop" in value:
            value["stop"] = ()
        elif isinstance(stop, str):
            value["stop"] = [stop]
    return value


WireSamplingParams = Annotated[SamplingParams, BeforeValidator(_from_wire)]
