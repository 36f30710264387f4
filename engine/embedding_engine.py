"""The embedding engine: texts in, one pooled vector per text out, batched like generation.

    engine = EmbeddingEngine(EngineConfig(model=folder))
    vectors = engine.embed(["a text", "another"])          # float32 [2, dim]
    engine.add_request("r1", text="...", dimensions=128); engine.step() -> [EmbeddingOutput]

An embedding request is prefill-only: the same `Scheduler` places it under the same token
budget (`max_num_batched_tokens`) and sequence cap (`max_num_seqs`) as a generation
request, it is pooled in the step that computes its last token, and then it is finished:
its KV blocks are freed at once, nothing is sampled, no token is generated.

    decoder (Qwen3 / Qwen2 / Mistral / Llama ... engine/model.py): causal, paged KV cache;
        a long input is prefilled in chunks and pooled as the chunks come (PoolState);
        last-token pooling may take a shared prefix from the prefix cache
    encoder (BERT, engine/bert_model.py): bidirectional, so a sequence runs whole in one
        step (the scheduler's chunked_prefill=False), no KV cache at all: the scheduler's
        block accounting only bounds the tokens of a step

The pooling is the model folder's (engine/pooling.py: sentence-transformers files; else
mean for an encoder, last token for a decoder), overridable by `pooling_mode` /
`normalize`. Texts longer than the model's `max_seq_length` are cut there, as
sentence-transformers cuts them (the tokenizer's own truncation: special tokens kept); token
ids given directly must fit (an error otherwise). `dimensions` cuts a vector (Matryoshka)
and renormalises it when the model normalises.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import pathlib
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from inflight.engine.bert_model import BertEncoder, is_encoder_config
from inflight.engine.config import EngineConfig
from inflight.engine.errors import ERR_INVALID_REQUEST, ERR_PROMPT_TOO_LONG, ERR_ENGINE, InflightError, ModelError
from inflight.engine.errors import ConfigError
from inflight.engine.kv_cache_manager import KVCacheManager
from inflight.engine.pooling import PoolState, PoolingConfig, finish_vector, pool, read_pooling_config
from inflight.engine.request import Request, RequestStatus
from inflight.engine.sampling_params import SamplingParams
from inflight.engine.scheduler import Scheduler, SchedulerOutput


class EmbeddingError(InflightError, ValueError):
    """An input given to `EmbeddingEngine.embed` cannot be embedded (the message names it)."""


def is_embedding_model(folder: str | pathlib.Path) -> bool:
    """Whether a model folder is an embedding model: sentence-transformers files
    (modules.json) or an encoder architecture (BERT). A decoder folder is a generation
    model unless told otherwise (`EmbeddingEngine` serves it as a last-token embedder)."""
    folder = pathlib.Path(folder)
    if (folder / "modules.json").is_file():
        return True
    cfg = folder / "config.json"
    return cfg.is_file() and is_encoder_config(json.loads(cfg.read_text()))


@dataclass(slots=True)
class EmbeddingOutput:
    """One request's final result: `embedding` (float32 [dim], None on error), or
    finish_reason "error" / "abort" with `error` and `error_code`.

    It reads like a final `RequestOutput` (no tokens, no text) so that the worker's
    publisher and metrics take it as they take a generation's end."""

    request_id: str
    embedding: np.ndarray | None
    num_prompt_tokens: int
    finish_reason: str = "stop"
    error: str | None = None
    error_code: str | None = None
    arrival_time: float = 0.0
    finish_time: float = 0.0
    finished: bool = True
    new_token_ids: tuple = ()
    token_ids: tuple = ()
    text_delta: str = ""
    text: str = ""
    num_cached_tokens: int = 0
    first_token_time: float | None = None
    stop_reason: str | None = None
    logprobs: None = None
    prompt_logprobs: None = None


@dataclass
class _Embedding:
    """Per-request pooling state beside its `Request`."""

    dimensions: int | None
    pooled: PoolState = field(default_factory=PoolState)


class EmbeddingEngine:
    kind = "embed"  # what a worker serving it announces (schemas/registry.py)

    def __init__(self, config: EngineConfig, *, pooling_mode: str | None = None,
                 normalize: bool | None = None):
        from tokenizers import Tokenizer as HFTokenizer

        self.config = config
        folder = pathlib.Path(config.model)
        cfg_path = folder / "config.json"
        if not cfg_path.is_file():
            raise ModelError(f"{folder} has no config.json: not a model folder")
        self.is_encoder = is_encoder_config(json.loads(cfg_path.read_text()))
        self.device = torch.device(config.device)
        if self.is_encoder:
            self.model = BertEncoder(folder, config.torch_dtype, self.device)
            hidden, vocab = self.model.config.hidden_size, self.model.config.vocab_size
        else:
            from inflight.engine.model import DecoderModel
            from inflight.kernels.ops import get_ops

            self.model = DecoderModel(folder, get_ops(config.kernels, config.device), config.torch_dtype,
                                      self.device, config.max_model_len)
            hidden, vocab = self.model.config.hidden_size, self.model.config.vocab_size
        self.vocab_size = vocab
        base = read_pooling_config(folder, "mean" if self.is_encoder else "lasttoken")
        self.pooling: PoolingConfig = base.with_overrides(mode=pooling_mode, normalize=normalize)
        self.dimension = hidden
        ctx = self.model.max_model_len if config.max_model_len is None else \
            min(config.max_model_len, self.model.max_model_len)
        self.max_seq_length = min(self.pooling.max_seq_length or ctx, ctx)
        bs = config.block_size
        budget = config.max_num_batched_tokens
        if self.is_encoder and self.max_seq_length > budget:
            raise ConfigError(f"an encoder runs each sequence whole: max_num_batched_tokens={budget} is "
                              f"below the model's max_seq_length {self.max_seq_length}; raise it")
        # The tokenizer, cutting at max_seq_length with its special tokens kept (a
        # tokenizer.json may carry a fixed padding and truncation of its own: both off)
        self.hf = HFTokenizer.from_file(str(folder / "tokenizer.json"))
        self.hf.no_padding()
        self.hf.enable_truncation(self.max_seq_length)
        # what each step may hold: every token of the budget, one partial block per sequence
        step_blocks = -(-budget // bs) + config.max_num_seqs
        if self.is_encoder:
            num_blocks, caching = step_blocks, False  # bookkeeping only: nothing is cached
            self.kv_caches = None
        else:
            num_blocks = config.num_kv_blocks or (step_blocks + 2 * -(-self.max_seq_length // bs))
            # NOTE: a prefix hit skips computing those tokens' hidden states: only the
            # last-token pooling, which reads the last (always computed) token, may take one
            caching = config.enable_prefix_caching and self.pooling.mode == "lasttoken"
            self.kv_caches = self.model.allocate_kv_cache(num_blocks, bs)
        self.num_kv_blocks = num_blocks
        root = hashlib.blake2b(f"{folder.resolve()}|{config.dtype}|embed".encode(), digest_size=16).digest()
        self.kv = KVCacheManager(num_blocks, bs, caching, root)
        self.scheduler = Scheduler(self.kv, config.max_num_seqs, budget, config.max_preemptions,
                                   chunked_prefill=not self.is_encoder)
        self.requests: dict[str, Request] = {}
        self._state: dict[str, _Embedding] = {}
        self._pending: list[EmbeddingOutput] = []
        self._arrivals = itertools.count()
        self._ids = itertools.count()
        self._params = SamplingParams(max_tokens=1)
        self.num_steps = 0
        self.num_tokens = 0

    # -- requests -------------------------------------------------------------------------
    def tokenize(self, texts: Sequence[str], prompt_name: str | None = None) -> list[list[int]]:
        """Token ids of each text (with the model's prompt prefix), cut at max_seq_length."""
        prefix = self.pooling.prompt_text(prompt_name)
        texts = [prefix + t for t in texts] if prefix else list(texts)
        return [e.ids for e in self.hf.encode_batch(texts)]

    def add_request(self, request_id: str, prompt: str | None = None,
                    prompt_token_ids: Sequence[int] | None = None, params: object = None,
                    priority: int = 0, *, dimensions: int | None = None,
                    prompt_name: str | None = None, arrival_time: float | None = None,
                    messages: Sequence[dict] | None = None, **_: object) -> None:
        """Queue one input: a text `prompt` (cut at max_seq_length, with the model's
        prompt prefix), or `prompt_token_ids` used as given. The generation engine's
        signature (the worker calls both alike): `params` has nothing to say here, and
        chat `messages` are refused. Problems with the input itself come back as an error
        output at the next step, never as an exception."""
        if request_id in self.requests:
            raise EmbeddingError(f"request id {request_id!r} is already active in this engine")
        error = None
        ids: list[int] = []
        token_ids = prompt_token_ids
        try:
            if messages is not None:
                error = (ERR_INVALID_REQUEST, "an embedding model embeds a text or token ids, "
                                              "not chat messages")
            elif token_ids is not None:
                ids = list(token_ids)
            elif prompt:
                ids = self.tokenize([prompt], prompt_name)[0]
        except InflightError as exc:
            error = (ERR_INVALID_REQUEST, str(exc))
        req = Request(request_id, ids, self._params, priority, arrival_time=arrival_time or time.time(),
                      arrival_index=next(self._arrivals))
        error = error or self._validate(req, token_ids is not None, dimensions)
        if error is not None:
            self._pending.append(self._output(req, None, "error", *reversed(error)))
            return
        self.requests[request_id] = req
        self._state[request_id] = _Embedding(dimensions)
        self.scheduler.add(req)

    def _validate(self, req: Request, given_ids: bool, dimensions: int | None) -> tuple[str, str] | None:
        n = req.num_prompt_tokens
        if n == 0:
            return ERR_INVALID_REQUEST, "the input is empty: send at least one token"
        bad = next((t for t in req.prompt_token_ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            return ERR_INVALID_REQUEST, f"token id {bad} is outside the vocabulary [0, {self.vocab_size})"
        if given_ids and n > self.max_seq_length:
            return ERR_PROMPT_TOO_LONG, (f"the input has {n} tokens but the model embeds at most "
                                         f"{self.max_seq_length}: shorten it")
        if dimensions is not None and not 1 <= dimensions <= self.dimension:
            return ERR_INVALID_REQUEST, (f"dimensions={dimensions}: the model's vectors have "
                                         f"{self.dimension}; ask for 1 to {self.dimension}")
        if not self.is_encoder and self.kv.blocks_for(n) > self.num_kv_blocks:
            return ERR_PROMPT_TOO_LONG, (f"the input needs {self.kv.blocks_for(n)} KV blocks but the "
                                         f"cache has {self.num_kv_blocks}: raise EngineConfig.num_kv_blocks")
        return None

    def abort(self, request_id: str) -> bool:
        req = self.requests.get(request_id)
        if req is None:
            return False
        self._pending.append(self._finish(req, None, "abort"))
        return True

    def has_unfinished(self) -> bool:
        return bool(self.requests or self._pending)

    # -- one step -------------------------------------------------------------------------
    def step(self) -> list[EmbeddingOutput]:
        outputs, self._pending = self._pending, []
        if not self.scheduler.has_unfinished():
            return outputs
        sched = self.scheduler.schedule()
        for req in sched.preempted:  # its blocks are gone: it starts over, and so does its pooling
            self._state[req.request_id].pooled = PoolState()
        for req in sched.failed:
            outputs.append(self._finish(req, None, "error", "preempted too often for lack of KV "
                                        "blocks: raise EngineConfig.num_kv_blocks", ERR_ENGINE))
        if sched.is_empty:
            return outputs
        try:
            with torch.inference_mode():
                done = self._run_encoder(sched) if self.is_encoder else self._run_decoder(sched)
        except Exception as exc:  # noqa: BLE001 - one bad pass fails its requests, not the caller
            for req in sched.requests:
                if not req.is_finished:
                    outputs.append(self._finish(req, None, "error", f"forward pass failed: {exc!r}", ERR_ENGINE))
            return outputs
        self.num_steps += 1
        self.num_tokens += sched.total_tokens
        if self.kv.enable_caching:
            self.kv.cache_completed(sched.requests, [r.num_computed_tokens for r in sched.requests])
        for req, vector in done:
            outputs.append(self._finish(req, vector, "stop"))
        return outputs

    def _run_encoder(self, sched: SchedulerOutput) -> list[tuple[Request, torch.Tensor]]:
        lens = sched.num_tokens
        ids = torch.tensor(list(itertools.chain.from_iterable(r.prompt_token_ids for r in sched.requests)),
                           dtype=torch.int64, device=self.device)
        positions = torch.cat([torch.arange(n) for n in lens]).to(self.device)
        hidden = self.model.forward(ids, positions, lens)
        ends = list(itertools.accumulate(lens))
        starts = [e - n for e, n in zip(ends, lens)]
        pooled = pool(hidden, starts, ends, self.pooling.mode).cpu()
        for req, n in zip(sched.requests, lens):
            req.num_computed_tokens += n
        return list(zip(sched.requests, pooled))

    def _run_decoder(self, sched: SchedulerOutput) -> list[tuple[Request, torch.Tensor]]:
        from inflight.engine.model import AttentionMetadata

        bs = self.config.block_size
        ids, positions, slots, seq_lens, qsl = [], [], [], [], [0]
        for req, n in zip(sched.requests, sched.num_tokens):
            start = req.num_computed_tokens
            ids += req.all_token_ids[start:start + n]
            pos = range(start, start + n)
            positions += pos
            table = req.block_ids
            slots += [table[p // bs] * bs + p % bs for p in pos]
            seq_lens.append(start + n)
            qsl.append(qsl[-1] + n)
        width = max(len(r.block_ids) for r in sched.requests)
        tables = torch.zeros(len(sched.requests), width, dtype=torch.int32)
        for i, req in enumerate(sched.requests):
            tables[i, :len(req.block_ids)] = torch.tensor(req.block_ids, dtype=torch.int32)
        dev = self.device
        meta = AttentionMetadata(slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
                                 block_tables=tables.to(dev),
                                 seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
                                 query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=dev))
        mode = self.pooling.mode
        if mode == "lasttoken":  # only each chunk's last row is read
            rows = torch.tensor(qsl[1:], dtype=torch.int64) - 1
        else:
            rows = torch.arange(qsl[-1], dtype=torch.int64)
        hidden = self.model.forward_hidden(torch.tensor(ids, dtype=torch.int64, device=dev),
                                           torch.tensor(positions, dtype=torch.int64, device=dev),
                                           meta, self.kv_caches, rows.to(dev)).float().cpu()
        done = []
        for i, (req, n) in enumerate(zip(sched.requests, sched.num_tokens)):
            state = self._state[req.request_id].pooled
            chunk = hidden[i:i + 1] if mode == "lasttoken" else hidden[qsl[i]:qsl[i + 1]]
            state.add(chunk, mode, first_chunk=req.num_computed_tokens == 0)
            req.num_computed_tokens += n
            if req.num_computed_tokens == req.num_tokens:
                done.append((req, state.result(mode)))
        return done

    # -- finishing --------------------------------------------------------------------------
    def _finish(self, req: Request, vector: torch.Tensor | None, reason: str,
                error: str | None = None, code: str | None = None) -> EmbeddingOutput:
        self.scheduler.remove(req)  # frees its blocks: no KV is kept after the pooling
        self.requests.pop(req.request_id, None)
        state = self._state.pop(req.request_id, None)
        if vector is not None:
            vector = finish_vector(vector, state.dimensions, self.pooling.normalize)
        return self._output(req, vector, reason, error, code)

    def _output(self, req: Request, vector: torch.Tensor | None, reason: str,
                error: str | None = None, code: str | None = None) -> EmbeddingOutput:
        req.status = RequestStatus.FINISHED
        return EmbeddingOutput(req.request_id, None if vector is None else vector.numpy().astype(np.float32),
                               req.num_prompt_tokens, reason, error, code, req.arrival_time, time.time())

    # -- offline use ------------------------------------------------------------------------
    def embed(self, inputs: Sequence[str] | Sequence[Sequence[int]], *, dimensions: int | None = None,
              prompt_name: str | None = None) -> np.ndarray:
        """Embed texts (or token-id lists) -> float32 [len(inputs), dim]; raises
        EmbeddingError naming the first input that failed."""
        outs = self.embed_outputs(inputs, dimensions=dimensions, prompt_name=prompt_name)
        for i, out in enumerate(outs):
            if out.embedding is None:
                raise EmbeddingError(f"input {i}: {out.error}")
        dim = dimensions or self.dimension
        return np.stack([o.embedding for o in outs]) if outs else np.zeros((0, dim), np.float32)

    def embed_outputs(self, inputs, *, dimensions: int | None = None,
                      prompt_name: str | None = None) -> list[EmbeddingOutput]:
        ids = []
        texts = [x for x in inputs if isinstance(x, str)]
        encoded = iter(self.tokenize(texts, prompt_name)) if texts else iter(())
        for x in inputs:
            rid = f"embed-{next(self._ids)}"
            ids.append(rid)
            if isinstance(x, str):
                # a text already cut (as add_request would): ids with the text's own limits
                tok = next(encoded)
                if x:
                    self.add_request(rid, prompt_token_ids=tok, dimensions=dimensions)
                else:
                    self.add_request(rid, prompt="", dimensions=dimensions)
            else:
                self.add_request(rid, prompt_token_ids=list(x), dimensions=dimensions)
        finals: dict[str, EmbeddingOutput] = {}
        while len(finals) < len(ids):
            for out in self.step():
                finals[out.request_id] = out
        return [finals[i] for i in ids]

    @property
    def max_model_len(self) -> int:
        return self.max_seq_length

    def stats(self) -> dict:
        """The generation engine's gauges' names where they mean the same."""
        used = self.kv.pool.num_used_blocks
        return {"num_steps": self.num_steps, "num_tokens": self.num_tokens,
                "running": len(self.scheduler.running), "waiting": self.scheduler.num_waiting,
                "num_running": len(self.scheduler.running), "num_waiting": self.scheduler.num_waiting,
                "kv_blocks_used": used, "kv_blocks_total": self.num_kv_blocks}
