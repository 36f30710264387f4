"""Between the wire and the engine: sampling params, building an engine.

The engine knows nothing of Kafka; these few conversions are the worker's edge.
"""

from __future__ import annotations

from typing import Any

from schemas import InferenceRequest, Settings


def engine_params(req: InferenceRequest) -> Any:
    from engine import SamplingParams as EngineSamplingParams

    p = req.params
    return EngineSamplingParams(max_tokens=p.max_tokens, temperature=p.temperature, top_p=p.top_p,
                                top_k=p.top_k, seed=p.seed, stop=tuple(p.stop),
                                stop_token_ids=tuple(p.stop_token_ids), ignore_eos=p.ignore_eos)


def build_engine(settings: Settings, model: str | None = None, *, max_num_seqs: int | None = None,
                 kv_cache_mb: int | None = None, device: str | None = None,
                 dtype: str | None = None) -> Any:
    from engine import Engine, EngineConfig
    from inflight.model import resolve_model

    path = resolve_model(model, settings)
    kw: dict[str, Any] = {"model": str(path), "max_num_seqs": max_num_seqs or settings.worker_max_inflight,
                          "cuda_graphs": None if settings.cuda_graphs else False,
                          "kv_cache_memory_fraction": settings.kv_cache_memory_fraction}
    if kv_cache_mb:
        kw["kv_cache_bytes"] = kv_cache_mb << 20
    if device:
        kw["device"] = device
    if dtype:
        kw["dtype"] = dtype
    return Engine(EngineConfig(**kw))
