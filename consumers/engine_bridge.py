"""Between the wire and the engine: sampling params, building an engine.

The engine knows nothing of Kafka; these few conversions are the worker's edge.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inflight.consumers.gpu_claim import AUTO, claim_gpu
from inflight.schemas import InferenceRequest, Settings
from inflight.schemas.tools import render_tool_messages


def chat_inputs(req: InferenceRequest, template_takes_tools: bool) -> tuple[list | None, dict]:
    """(messages, extra add_request keywords) of a request: its chat turns as dicts, with
    tools and tool turns rendered the way the model's template reads them
    (schemas.tools.render_tool_messages); `tools` go to a template that takes them."""
    if req.messages is None:
        return None, {}
    messages = [m.model_dump(mode="json", exclude_none=True) for m in req.messages]
    uses_tools = req.tools is not None and req.tool_choice != "none"
    if not (uses_tools or any(m.role == "tool" or m.tool_calls for m in req.messages)):
        return messages, {}
    tools = [t.model_dump(mode="json", exclude_none=True) for t in req.tools] if uses_tools else None
    messages = render_tool_messages(messages, tools, template_takes_tools)
    return messages, ({"tools": tools} if template_takes_tools and tools else {})


LOGPROB_FLOOR = -9999.0  # OpenAI's stand-in for -inf (JSON has no infinities)


class LogprobShaper:
    """Engine logprob entries -> OpenAI's shapes (`{"content": [{token, logprob, bytes,
    top_logprobs}]}`), with each token's text and bytes from the model's tokenizer, cached
    per token id (the vocabulary is fixed)."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self._pieces: dict[int, tuple[str, list[int]]] = {}

    def piece(self, token_id: int) -> tuple[str, list[int]]:
        got = self._pieces.get(token_id)
        if got is None:
            raw = self.tokenizer.token_bytes(token_id)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:  # part of a character: OpenAI's notation
                text = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
            got = self._pieces[token_id] = (text, list(raw))
        return got

    def entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        text, raw = self.piece(token_id)
        lp = logprob if logprob == logprob and logprob > LOGPROB_FLOOR else LOGPROB_FLOOR
        return {"token": text, "logprob": lp, "bytes": raw}

    def position(self, e: Any) -> dict[str, Any] | None:
        if e is None:
            return None
        d = self.entry(e.token_id, e.logprob)
        d["top_logprobs"] = [self.entry(t, lp) for t, lp in e.top]
        return d

    def __call__(self, out: Any) -> tuple[dict | None, list | None]:
        """(FinalEvent.logprobs, FinalEvent.prompt_logprobs) of a final engine output."""
        lps = getattr(out, "logprobs", None)
        plps = getattr(out, "prompt_logprobs", None)
        return (None if lps is None else {"content": [self.position(e) for e in lps]},
                None if plps is None else [self.position(e) for e in plps])


# Settings field -> EngineConfig field, for the engine knobs a deployment sets from
# INFLIGHT_* (None in Settings = keep the engine's own default).
ENGINE_SETTINGS = ("device", "dtype", "max_num_seqs", "max_num_batched_tokens", "max_model_len",
                   "kv_cache_bytes", "block_size", "enable_prefix_caching", "kernels",
                   "cuda_graphs", "kv_cache_memory_fraction", "tensor_parallel_size",
                   "speculative_config", "kv_cache_dtype", "cache_dir")


def engine_overrides(settings: Settings, *, max_num_seqs: int | None = None,
                     kv_cache_mb: int | None = None, device: str | None = None,
                     dtype: str | None = None, tensor_parallel_size: int | None = None,
                     kv_cache_dtype: str | None = None) -> dict[str, Any]:
    """EngineConfig keyword arguments from the settings; explicit arguments (the worker's
    command-line flags) win. `max_num_seqs` falls back to the worker's in-flight limit."""
    kw: dict[str, Any] = {name: getattr(settings, name) for name in ENGINE_SETTINGS
                          if getattr(settings, name) is not None}
    kw["max_num_seqs"] = max_num_seqs or settings.max_num_seqs or settings.worker_max_inflight
    if kv_cache_mb:
        kw["kv_cache_bytes"] = kv_cache_mb << 20
    if device:
        kw["device"] = device
    if dtype:
        kw["dtype"] = dtype
    if tensor_parallel_size:
        kw["tensor_parallel_size"] = tensor_parallel_size
    if kv_cache_dtype:
        kw["kv_cache_dtype"] = kv_cache_dtype
    return kw


def build_engine(settings: Settings, model: str | None = None, *, max_num_seqs: int | None = None,
                 kv_cache_mb: int | None = None, device: str | None = None,
                 dtype: str | None = None, tensor_parallel_size: int | None = None,
                 kv_cache_dtype: str | None = None) -> Any:
    from inflight.engine import Engine, EngineConfig
    from inflight.engine.model_folder import resolve_model

    path = resolve_model(model or settings.model_path, settings.cache_dir)
    kw = engine_overrides(settings, max_num_seqs=max_num_seqs, kv_cache_mb=kv_cache_mb,
                          device=device, dtype=dtype, tensor_parallel_size=tensor_parallel_size,
                          kv_cache_dtype=kv_cache_dtype)
    claim = None
    if kw.get("device") == AUTO:
        import torch

        index, claim = claim_gpu(settings.gpu_lock_dir or Path(settings.data_dir) / "gpu-locks",
                                 torch.cuda.device_count(), kw.get("tensor_parallel_size", 1))
        kw["device"] = f"cuda:{index}"  # tensor-parallel rank r: cuda:index + r
    engine = Engine(EngineConfig(model=str(path), **kw))
    engine.device_claim = claim  # NOTE: keeps the GPUs' lock files open as long as the engine lives
    return engine
