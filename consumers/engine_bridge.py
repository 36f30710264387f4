"""Between the wire and the engine: sampling params, building an engine.

The engine knows nothing of Kafka; these few conversions are the worker's edge.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inflight.consumers.gpu_claim import AUTO, claim_gpu
from inflight.schemas import InferenceRequest, Settings
from inflight.schemas.tools import render_tool_messages

if TYPE_CHECKING:
    from inflight.engine.logprobs import TokenLogprob
    from inflight.engine.outputs import RequestOutput
    from inflight.engine.tokenizer import Tokenizer


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

    def __init__(self, tokenizer: Tokenizer):
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

    def position(self, e: TokenLogprob | None) -> dict[str, Any] | None:
        if e is None:
            return None
        d = self.entry(e.token_id, e.logprob)
        d["top_logprobs"] = [self.entry(t, lp) for t, lp in e.top]
        return d

    def __call__(self, out: RequestOutput) -> tuple[dict | None, list | None]:
        """(FinalEvent.logprobs, FinalEvent.prompt_logprobs) of a final engine output."""
        lps = out.logprobs
        plps = out.prompt_logprobs
        return (None if lps is None else {"content": [self.position(e) for e in lps]},
                None if plps is None else [self.position(e) for e in plps])


def engine_config(settings: Settings) -> Any:
    """The worker's EngineConfig, the one place settings become one: every engine option of
    the settings (Settings.engine_options: INFLIGHT_<NAME>, or `inflight worker --<name>`
    over it), the model folder of INFLIGHT_MODEL_PATH (None: the bundled model, converted
    once), as many running requests as the worker holds in flight unless
    INFLIGHT_MAX_NUM_SEQS says otherwise, and INFLIGHT_CACHE_DIR for what the engine
    measures at its first start (engine/spec/verify_costs.py)."""
    from inflight.engine import EngineConfig
    from inflight.engine.model_folder import resolve_model

    kw = settings.engine_options()
    kw.setdefault("max_num_seqs", settings.worker_max_inflight)
    kw.setdefault("cache_dir", settings.cache_dir)  # start-up measurements kept there
    if settings.worker_loras:
        kw.setdefault("max_loras", len(settings.worker_loras))
    return EngineConfig(model=str(resolve_model(settings.model_path, settings.cache_dir)), **kw)


def build_engine(settings: Settings) -> Any:
    """The worker's engine (engine_config); `--device cuda:auto` claims free GPUs first."""
    from inflight.engine import Engine
    from inflight.engine.embedding_engine import EmbeddingEngine, is_embedding_model

    config = engine_config(settings)
    claim = None
    if config.device == AUTO:
        import torch

        index, claim = claim_gpu(settings.gpu_lock_dir or Path(settings.data_dir) / "gpu-locks",
                                 torch.cuda.device_count(), config.tensor_parallel_size)
        config = dataclasses.replace(config, device=f"cuda:{index}")  # rank r: cuda:index + r
    kind = settings.model_kind
    if kind == "embed" or (kind == "auto" and is_embedding_model(config.model)):
        engine = EmbeddingEngine(config)
    else:
        engine = Engine(config)
        for name, path in settings.worker_loras.items():  # read and checked now: a bad one stops the start
            engine.add_lora(name, path)
    engine.device_claim = claim  # NOTE: keeps the GPUs' lock files open as long as the engine lives
    return engine
