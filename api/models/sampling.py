"""The request fields OpenAI's chat and text completions share, typed once: strict as
OpenAI is ("5" and true are not 5, NaN is not a number), vLLM's top_k, stop_token_ids and
ignore_eos, and the parameters accepted only at their neutral values (anything else is a
400 naming the parameter)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from inflight.schemas.params import MAX_STOP_CHARS, MAX_STOP_STRINGS, MAX_STOP_TOKEN_IDS, SEED_MAX, TokenId

Strict = Field(strict=True)
StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: Annotated[bool, Strict] | None = None


class OpenAISampling(BaseModel):
    model_config = ConfigDict(extra="forbid")

    temperature: Annotated[float, Field(ge=0.0, le=100.0, strict=True, allow_inf_nan=False)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0, strict=True, allow_inf_nan=False)] | None = None
    top_k: Annotated[int, Field(ge=-1, le=1_000_000, strict=True)] | None = None
    seed: Annotated[int, Field(ge=0, le=SEED_MAX, strict=True)] | None = None
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)] | None = None
    stop_token_ids: Annotated[list[Annotated[TokenId, Strict]], Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    ignore_eos: Annotated[bool, Strict] | None = None
    stream: Annotated[bool, Strict] | None = None
    stream_options: StreamOptions | None = None
    # accepted only at their neutral values
    n: Annotated[int, Field(ge=1, le=1, strict=True)] | None = None
    presence_penalty: Annotated[float, Field(ge=0, le=0, strict=True)] | None = None
    frequency_penalty: Annotated[float, Field(ge=0, le=0, strict=True)] | None = None
    logit_bias: Annotated[dict[str, float], Field(max_length=0)] | None = None
    user: str | None = None
