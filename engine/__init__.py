"""The continuous-batching engine: Llama-family model on a paged, prefix-shared KV cache.

    from inflight.engine import Engine, EngineConfig, SamplingParams, RequestOutput
"""

from inflight.engine.config import EngineConfig
from inflight.engine.engine import DuplicateRequestError, Engine
from inflight.engine.outputs import RequestOutput
from inflight.engine.sampling_params import SamplingParams, SamplingParamsError

__all__ = ["Engine", "EngineConfig", "SamplingParams", "RequestOutput", "DuplicateRequestError",
           "SamplingParamsError"]
