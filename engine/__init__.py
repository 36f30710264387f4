"""The continuous-batching engine: decoder-only models on a paged, prefix-shared KV cache.

    from inflight.engine import Engine, EngineConfig, SamplingParams, RequestOutput

Imports nothing of the service (no pydantic, Kafka, SQL). The names below load on first
use, so the wire (`inflight.schemas`) can take `SamplingParams` and the error classes from
here without importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from inflight.engine.errors import needs_extra

_EXPORTS = {
    "Engine": "inflight.engine.engine",
    "DuplicateRequestError": "inflight.engine.engine",
    "EngineConfig": "inflight.engine.config",
    "RequestOutput": "inflight.engine.outputs",
    "SamplingParams": "inflight.engine.sampling_params",
    "SamplingParamsError": "inflight.engine.sampling_params",
    "StructuredOutputs": "inflight.engine.structured_outputs",
}

__all__ = list(_EXPORTS)

if TYPE_CHECKING:
    from inflight.engine.config import EngineConfig
    from inflight.engine.engine import DuplicateRequestError, Engine
    from inflight.engine.outputs import RequestOutput
    from inflight.engine.sampling_params import SamplingParams, SamplingParamsError
    from inflight.engine.structured_outputs import StructuredOutputs


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'inflight.engine' has no attribute {name!r}")
    with needs_extra("worker", f"inflight.engine.{name}"):  # torch, tokenizers, ...
        value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
