"""The continuous-batching engine: Llama-family model on a paged, prefix-shared KV cache.

    from engine import Engine, EngineConfig, SamplingParams, RequestOutput
"""

from engine.config import EngineConfig
from engine.engine import DuplicateRequestError, Engine
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams, SamplingParamsError

__all__ = ["Engine", "EngineConfig", "SamplingParams", "RequestOutput", "DuplicateRequestError",
           "SamplingParamsError"]
