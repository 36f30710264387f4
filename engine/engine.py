"""The engine: requests in, one batched forward pass per `step()`, token deltas out.

    engine = Engine(EngineConfig(model=path))
    engine.add_request("r1", prompt="Hello", params=SamplingParams(max_tokens=32))
    while engine.has_unfinished():
        for out in engine.step(): ...

Bad requests (empty, too long for the context or the KV cache, token ids outside the
vocabulary) never raise: they finish at the next step with finish_reason "error".
`priority`: lower values are served first and preempted last (vLLM's convention); batch
work should use a higher value. Not thread-safe: one thread calls add/abort/step.
For the service: `engine.tokenizer` (encode/decode/apply_chat_template, eos_token_ids),
`engine.max_model_len`, and `add_request(..., messages=[...], arrival_time=...)`.

With `overlap_outputs` (the default on CUDA) a step launches the next forward pass first
and then processes the previous one's tokens while the device runs, so `step()` returns
the outputs of the step before; the outputs, their order and finish reasons are the same.
A request that stops (EOS, stop string) was already scheduled once more: that token is
dropped. A step's full blocks enter the prefix cache once that step has completed (its
result read without error), never while it may still be writing them.

On CUDA the engine's device is made current, and its own stream the current stream,
around everything it does on the device (`DeviceScope`, engine/device.py), on whichever
thread calls; `cuda` means the current device, `cuda:N` that one. Without an explicit
`kv_cache_bytes` / `num_kv_blocks` the KV cache is sized after a profiling step at the
largest batch (engine/startup.py) and the figures are logged.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import logging
import pathlib
import time
from typing import Sequence

import torch

from inflight.engine.config import EngineConfig
from inflight.engine.detokenizer import IncrementalDetokenizer, output_text
from inflight.engine.device import DeviceScope, resolve_device
from inflight.engine.kv_sizing import MemoryProbe
from inflight.engine.kv_cache_manager import KVCacheManager
from inflight.engine.logprobs import ScoreOutput, StepLogprobs, TokenLogprob, extend_prompt_logprobs
from inflight.engine.device_step import StepHandle
from inflight.engine.outputs import RequestOutput
from inflight.engine.parallel import TensorParallelGroup
from inflight.engine.request import Request, RequestStatus
from inflight.engine.sampling_params import SamplingParams
from inflight.engine.scheduler import Scheduler, SchedulerOutput
from inflight.engine.spec.build import build_spec_decoder
from inflight.engine.startup import build_device_side
from inflight.engine.stats import EngineStats
from inflight.engine.tokenizer import Tokenizer
from inflight.engine.errors import EngineDeadError, InflightError
from inflight.engine.lora.adapter import LoraError
from inflight.engine.errors import ERR_ENGINE, ERR_INVALID_REQUEST, ERR_MODEL_NOT_FOUND, ERR_PROMPT_TOO_LONG
from inflight.engine.lora import LoraAdapter, LoraManager, LoraSlots
from inflight.engine.grammar_queue import GrammarQueue

log = logging.getLogger(__name__)


class DuplicateRequestError(InflightError, ValueError):
    """A request id is already active in this engine."""


class ScoreError(InflightError, ValueError):
    """A text given to `Engine.score` cannot be scored (empty, longer than the context)."""


class Engine:
    def __init__(self, config: EngineConfig, *, memory_probe: MemoryProbe | None = None,
                 parallel_group: TensorParallelGroup | None = None):
        """`memory_probe` measures device memory for sizing the KV cache (default: torch's
        CUDA allocator, on CUDA); a fake one runs the sizing on CPU (tests).
        `parallel_group`: a running tensor-parallel group to load onto (engines one after
        another on the same ranks: tests, benchmarks); by default the engine starts its own
        when `config.tensor_parallel_size` > 1 and stops it in `close()`."""
        self.config = config
        self.device = resolve_device(config.device)
        self.scope = DeviceScope(self.device)
        folder = pathlib.Path(config.model)
        with self.scope:
            side = build_device_side(config, folder, self.scope, memory_probe, parallel_group)
        self.ops, self.model, self.runner = side.ops, side.model, side.runner
        self.parallel = side.parallel
        self.num_kv_blocks, self.cuda_graphs, self.kv_plan = side.num_kv_blocks, side.cuda_graphs, side.kv_plan
        self.max_model_len = self.model.max_model_len
        self.block_size = config.block_size
        self.tokenizer = Tokenizer(folder, self.model.config.eos_token_ids)
        root = hashlib.blake2b(f"{folder.resolve()}|{config.dtype}".encode(), digest_size=16).digest()
        self.kv = KVCacheManager(self.num_kv_blocks, config.block_size, config.enable_prefix_caching, root)
        self.lora = self._build_lora() if config.max_loras else None
        self.scheduler = Scheduler(self.kv, config.max_num_seqs, config.max_num_batched_tokens,
                                   config.max_preemptions, lora=self.lora,
                                   fair_share=config.fair_share,
                                   tenant_weights=config.tenant_weights)
        # (deadline, arrival index, request) of the requests that have one (a heap)
        self._deadlines: list[tuple[float, int, Request]] = []
        self.overlap = config.resolve_overlap_outputs()
        self._inflight: StepHandle | None = None  # launched, outputs not processed (overlap)
        self.requests: dict[str, Request] = {}
        self._pending: list[RequestOutput] = []  # finished outside a step (errors, aborts)
        self._arrivals = itertools.count()
        self._gen_ids = itertools.count()
        self.eos_token_ids = frozenset(self.tokenizer.eos_token_ids)
        self.counters = EngineStats()
        self.spec = build_spec_decoder(config, self.runner, self.kv)  # None without speculative_config
        # constrained requests whose grammar is compiling (not queued yet)
        self.grammars = GrammarQueue(self.tokenizer, self.model.config.vocab_size, self.runner)
        self._num_processed = 0  # live requests with logits processors (no speculation then)

    def _build_lora(self) -> LoraManager:
        """The manager (engine/lora) of the adapters' slot tensors on the model."""
        slots = self.model.lora  # allocated with the weights (engine/startup.py)
        assert isinstance(slots, LoraSlots)
        return LoraManager(self.model.config, slots, self.config.lora_cpu_capacity)

    # -- LoRA adapters ------------------------------------------------------------------
    def add_lora(self, name: str, path: str | pathlib.Path) -> LoraAdapter:
        """Register the PEFT LoRA folder `path` as adapter `name` (read and checked now:
        LoraError); requests name it by `lora`. Loaded into a slot when a request needs it."""
        if self.lora is None:
            raise LoraError(f"this engine serves no LoRA adapters (max_loras=0): set "
                            f"EngineConfig.max_loras (inflight worker --max-loras) to load {name!r}")
        return self.lora.add(name, path)

    def remove_lora(self, name: str) -> None:
        """Unregister adapter `name` (LoraError while an unfinished request names it)."""
        if self.lora is None:
            raise LoraError(f"adapter {name!r} is not loaded (this engine serves none: max_loras=0)")
        self.lora.remove(name, sum(1 for r in self.requests.values() if r.lora == name))

    def list_loras(self) -> list[dict]:
        """The registered adapters: name, path, rank, and whether each is resident in a slot."""
        if self.lora is None:
            return []
        m = self.lora
        return [{"name": n, "path": str(m.paths[n]), "resident": n in m.slot_of} for n in m.names()]

    def close(self) -> None:
        """Stop the engine's tensor-parallel ranks (or release a group it was given); a
        one-process engine has nothing to close. The engine cannot step afterwards."""
        if self.parallel is not None:
            self.parallel.release()
            self.parallel = None

    def bind_thread(self) -> None:
        """Make this engine's device current on the calling thread for good (the thread
        that steps the engine calls it once; every step enters the device scope anyway)."""
        self.scope.bind_thread()

    # -- requests -------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | None = None,
                    prompt_token_ids: Sequence[int] | None = None,
                    params: SamplingParams | None = None, priority: int = 0, *,
                    messages: Sequence[dict] | None = None, arrival_time: float | None = None,
                    extra_keys: tuple = (), tools: Sequence[dict] | None = None,
                    lora: str | None = None, tenant: str | None = None,
                    deadline: float | None = None) -> None:
        """Queue a request (text `prompt`, `prompt_token_ids`, or chat `messages`). Lower
        `priority` values are served first. Problems with the request itself surface as a
        final output with finish_reason "error" at the next step. `tools`: OpenAI function
        definitions for a chat template that renders them (`tokenizer.takes_tools`).
        `lora`: the name of a registered LoRA adapter to run with (`add_lora`); unknown:
        an error final `model_not_found`. `tenant`: who it is for (fair share,
        EngineConfig.fair_share). `deadline` (epoch seconds): not started by then, it ends
        with finish_reason "expired" without running; running then, it stops and ends
        "expired" with the tokens it produced."""
        if request_id in self.requests:
            raise DuplicateRequestError(f"request id {request_id!r} is already active in this "
                                        "engine; wait for its final output or abort it first")
        params = params or SamplingParams()
        error: tuple[str, str] | None = None
        try:
            if prompt_token_ids is None:
                if messages is not None:
                    # the template already holds any BOS it wants (as in HF's apply_chat_template)
                    text = self.tokenizer.apply_chat_template(messages, tools=tools)
                    prompt_token_ids = self.tokenizer.encode(text, add_special_tokens=False)
                else:
                    prompt_token_ids = self.tokenizer.encode(prompt) if prompt else []
        except InflightError as exc:
            prompt_token_ids, error = [], (ERR_INVALID_REQUEST, str(exc))
        extra_keys = tuple(extra_keys)
        if lora is not None:
            if self.lora is None or lora not in self.lora:
                served = self.lora.names() if self.lora is not None else []
                error = error or (ERR_MODEL_NOT_FOUND, f"LoRA adapter {lora!r} is not loaded here "
                                  f"(loaded: {served}): load it first (inflight lora load)")
            else:
                # NOTE: the same prompt under two adapters (or two versions of one) never
                # shares KV blocks: the adapter's identity is in every block hash
                extra_keys = (("lora", lora, self.lora.digests[lora]),) + extra_keys
        req = Request(request_id, list(prompt_token_ids), params, priority,
                      arrival_time=arrival_time or time.time(), arrival_index=next(self._arrivals),
                      extra_keys=extra_keys, lora=lora if error is None else None,
                      tenant=tenant, deadline=deadline)
        req.max_num_tokens = min(req.num_prompt_tokens + params.max_tokens, self.max_model_len)
        error = error or self._validate(req) or self._processors(req)
        if error is not None:
            code, message = error
            self._pending.append(self._finish_output(req, "error", message, code))
            return
        if params.seed is not None and params.temperature > 0:  # greedy rows never draw
            req.generator = torch.Generator(device=self.model.device)
            req.generator.manual_seed(params.seed)
        req.detok = IncrementalDetokenizer(self.tokenizer, req.prompt_token_ids, params.stop)
        if deadline is not None and deadline <= time.time():
            self._pending.append(self._finish_output(req, "expired", None))
            return
        self.requests[request_id] = req
        if deadline is not None:
            heapq.heappush(self._deadlines, (deadline, req.arrival_index, req))
        if params.structured_outputs is not None:
            self.grammars.submit(req)  # queued once compiled (_admit_compiled)
        else:
            self.scheduler.add(req)

    def _admit_compiled(self, outputs: list[RequestOutput]) -> None:
        """Queue the requests whose grammar is compiled; end those whose grammar failed."""
        ready, failed = self.grammars.take_ready()
        for req in ready:
            self.scheduler.add(req)
        for req, message, code in failed:
            outputs.append(self._finish(req, "error", message, code))

    def _validate(self, req: Request) -> tuple[str, str] | None:
        """(error code, message) when the request cannot run here, else None."""
        n, max_tokens, ctx = req.num_prompt_tokens, req.params.max_tokens, self.max_model_len
        if n == 0:
            return ERR_INVALID_REQUEST, "the prompt is empty: send at least one token"
        vocab = self.model.config.vocab_size
        bad = next((t for t in req.prompt_token_ids if not 0 <= t < vocab), None)
        if bad is not None:
            return ERR_INVALID_REQUEST, f"prompt token id {bad} is outside the vocabulary [0, {vocab})"
        stop = req.params.stop_token_ids
        i = next((i for i, t in enumerate(stop) if not 0 <= t < vocab), None)
        if i is not None:
            return ERR_INVALID_REQUEST, (f"stop_token_ids[{i}]={stop[i]} is outside the model's "
                                         f"vocabulary [0, {vocab}): it could never be sampled")
        if n >= ctx:
            return ERR_PROMPT_TOO_LONG, (f"the prompt has {n} tokens but the model context is {ctx} tokens "
                    "(room for at least one output token is needed): shorten the prompt")
        if n + max_tokens > ctx:
            return ERR_PROMPT_TOO_LONG, (f"prompt ({n} tokens) + max_tokens ({max_tokens}) = {n + max_tokens} exceeds "
                    f"the model context of {ctx} tokens: lower max_tokens to at most {ctx - n}")
        need = self.kv.blocks_for(n + max_tokens - 1)
        if need > self.num_kv_blocks:
            return ERR_PROMPT_TOO_LONG, (f"prompt + max_tokens needs {need} KV blocks but the whole cache has "
                    f"{self.num_kv_blocks}: lower max_tokens or raise EngineConfig.kv_cache_bytes")
        return None

    def _processors(self, req: Request) -> tuple[str, str] | None:
        """Set up req's logits processors (engine/logits_processors.py); (error code,
        message) when it asks for one this engine cannot apply."""
        p = req.params
        if not p.uses_logits_processors:
            return None
        vocab = self.model.config.vocab_size
        for name, ids in (("logit_bias", p.logit_bias or ()), ("allowed_token_ids", p.allowed_token_ids or ())):
            bad = next((t for t in ids if not 0 <= t < vocab), None)
            if bad is not None:
                return ERR_INVALID_REQUEST, (f"{name} names token id {bad}, outside the model's "
                                             f"vocabulary [0, {vocab})")
        if self.spec is not None and p.speculative:
            return ERR_INVALID_REQUEST, (
                "penalties, logit_bias, min_p, min_tokens, bad_words and allowed_token_ids are "
                "not supported with speculative decoding (they apply to one logits row per "
                "request, a verification has several): leave speculative unset or false")
        banned = []
        for word in p.bad_words:
            for variant in (word, " " + word.lstrip(" ")):  # as vLLM: with and without a space
                ids = self.tokenizer.encode(variant, add_special_tokens=False)
                if len(ids) > 1:
                    return ERR_INVALID_REQUEST, (
                        f"bad_words entry {variant!r} is {len(ids)} tokens for this model: only "
                        "words of one token are supported (a longer word is not supported: "
                        "banning it needs the output's tail at every step); ban its tokens "
                        "with logit_bias -100 instead")
                banned += ids
        req.banned_token_ids = tuple(dict.fromkeys(banned))
        self.runner.enable_logits_processors(self.eos_token_ids)
        self._num_processed += 1
        return None

    def abort(self, request_id: str) -> bool:
        """Stop a waiting or running request; its final output (finish_reason "abort")
        comes with the next step. Returns False for unknown or finished ids."""
        req = self.requests.get(request_id)
        if req is None:
            return False
        self._pending.append(self._finish(req, "abort", None))
        return True

    def has_unfinished(self) -> bool:
        return bool(self.requests or self._pending or self._inflight)

    # -- one step -------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        with self.scope:
            return self._step()

    def _expire(self, outputs: list[RequestOutput]) -> None:
        """End the requests whose deadline has passed (before anything is scheduled: one
        not started never runs)."""
        now = time.time()
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            req = heapq.heappop(heap)[2]
            if not req.is_finished and self.requests.get(req.request_id) is req:
                outputs.append(self._finish(req, "expired", None))

    def _step(self) -> list[RequestOutput]:
        outputs, self._pending = self._pending, []
        if self._deadlines:
            self._expire(outputs)
        if self.grammars.waiting:
            self._admit_compiled(outputs)
            if self.grammars.waiting and not outputs and not self.scheduler.has_unfinished() \
                    and self._inflight is None:
                self.grammars.nap()
                self._admit_compiled(outputs)
        if self.overlap:
            if self.spec is None or self._num_processed or \
                    not self.spec.may_speculate(self.scheduler.running):
                return self._step_overlapped(outputs)
            # NOTE: drafts are proposed from the last step's tokens: a step that may
            # speculate runs synchronously, after the step in flight is processed
            prev, self._inflight = self._inflight, None
            if prev is not None:
                self._process(prev, outputs)
        if not self.scheduler.has_unfinished():
            return outputs
        # NOTE: logits processors run on one logits row per request: while a request that
        # uses one is live (waiting ones too: they may join this step), nothing speculates
        drafts = (self.spec.propose(self.scheduler.running)
                  if self.spec is not None and not self._num_processed else None)
        sched = self._schedule(outputs, drafts)
        if sched.is_empty:
            return outputs
        try:
            handle, tokens = self.runner.execute(sched)
        except Exception as exc:  # noqa: BLE001 - one bad pass must not kill the engine's caller
            log.exception("forward pass failed")
            self._fail(sched.requests, exc, outputs)
            return outputs
        samplers = handle.samplers
        self._advance(sched, len(samplers))
        if handle.emitted is not None:
            self.spec.roll_back(sched, handle, tokens, self.kv, self.runner.batch)
        self._cache_completed(handle)
        now = time.time()
        accept = self._accept_run if handle.emitted is not None else self._accept_token
        if handle.logprobs is None:
            outputs += [accept(req, token, now) for req, token in zip(samplers, tokens)]
        else:
            lps = self._take_logprobs(handle.logprobs)
            outputs += [accept(req, token, now, lps.get(req)) for req, token in zip(samplers, tokens)]
        if self.config.debug_checks:
            self.kv.check_invariants(list(self.requests.values()))
        return outputs

    def _step_overlapped(self, outputs: list[RequestOutput]) -> list[RequestOutput]:
        """Launch step N+1, then process step N's tokens while the device runs N+1.

        NOTE: step N+1 is scheduled before N's tokens are known: each request that
        sampled in N has `num_pending` 1, counts that token as one to compute, and the
        runner feeds it to N+1 from N's sampled ids on the device. A request N's tokens
        finish was computed once more in N+1: that token is dropped (it is finished)."""
        launched, failed = None, None
        sched = None
        if self._inflight is not None and self._inflight.constrained:
            # NOTE: a constrained request's next mask needs the token the step in flight
            # samples: process that step first (no overlap while grammars run)
            prev, self._inflight = self._inflight, None
            self._process(prev, outputs)
        if self.scheduler.has_unfinished():
            sched = self._schedule(outputs)
            if not sched.is_empty:
                try:
                    launched = self.runner.launch(sched, overlapped=True)
                except Exception as exc:  # noqa: BLE001
                    log.exception("forward pass failed")
                    failed = exc
                else:
                    self._advance(sched, len(launched.samplers))
                    for req in launched.samplers:
                        req.num_pending += 1
        prev, self._inflight = self._inflight, launched
        if prev is not None:
            self._process(prev, outputs)
        if failed is not None:
            self._fail([r for r in sched.requests if not r.is_finished], failed, outputs)
        if self.config.debug_checks:
            self.kv.check_invariants(list(self.requests.values()))
        return outputs

    def _process(self, handle: StepHandle, outputs: list[RequestOutput]) -> None:
        try:
            tokens = self.runner.result(handle)
        except Exception as exc:  # noqa: BLE001
            log.exception("forward pass failed")
            self._fail([r for r in handle.requests if not r.is_finished], exc, outputs)
            return
        self._cache_completed(handle)  # before the tokens: a request they finish frees its blocks
        now = time.time()
        lps = self._take_logprobs(handle.logprobs)
        for req, token in zip(handle.samplers, tokens):
            if req.is_finished:  # aborted or stopped while this step ran: drop the token
                continue
            req.num_pending -= 1
            outputs.append(self._accept_token(req, token, now, lps.get(req) if lps else None))

    def _schedule(self, outputs: list[RequestOutput], drafts: dict | None = None) -> SchedulerOutput:
        sched = self.scheduler.schedule(drafts)
        for req in sched.preempted:
            self.runner.remove(req)
        for req in sched.failed:
            outputs.append(self._finish(req, "error", (
                f"preempted {req.num_preemptions} times for lack of KV blocks "
                f"(EngineConfig.max_preemptions={self.config.max_preemptions}): raise "
                "kv_cache_bytes or lower max_num_seqs"), ERR_ENGINE))
        return sched

    def _advance(self, sched, num_sampled: int) -> None:
        """The scheduled tokens' K/V are (being) computed: move the requests forward."""
        decodes = 0
        spec = sched.spec_token_ids
        for req, n in zip(sched.requests, sched.num_tokens):
            req.num_computed_tokens += n
            # a decode: one token, after some output, catching up with all tokens
            if n == 1 and (req.output_token_ids or req.num_pending) and \
                    req.num_computed_tokens == req.num_tokens + req.num_pending:
                decodes += 1
            elif spec and req in spec:  # a verification: the last token and its drafts
                decodes += n
        self.counters.record_step(sched.total_tokens, decodes, len(sched.requests), num_sampled)

    def _cache_completed(self, handle: StepHandle) -> None:
        """Make the full blocks a completed step wrote findable in the prefix cache.

        NOTE: only once the step is done: with overlapped outputs the next step is already
        launched, and a request's computed tokens count that step's too; until a step's
        result is read without error its blocks may hold nothing valid (a failed step),
        and a hit on them would read garbage. A request preempted since holds no blocks
        (its computed count is 0); every token of a completed step's positions is known
        on the host by now (the step before it was processed first)."""
        if self.kv.enable_caching:
            self.kv.cache_completed(handle.requests, handle.seq_lens)

    def _fail(self, reqs: list[Request], exc: Exception, outputs: list[RequestOutput]) -> None:
        if isinstance(exc, EngineDeadError):  # no next step can succeed: the caller must stop
            raise exc
        for req in reqs:
            outputs.append(self._finish(req, "error", f"forward pass failed: {exc!r}", ERR_ENGINE))

    @staticmethod
    def _take_logprobs(step: StepLogprobs | None) -> dict:
        """The step's prompt logprobs go onto their requests; returns the sampled tokens'."""
        if step is None:
            return {}
        for req, first, entries in step.prompt_entries:
            if not req.is_finished:
                extend_prompt_logprobs(req, first, entries)
        return step.by_request

    def _append_token(self, req: Request, token: int, now: float,
                      logprob: TokenLogprob | None) -> str | None:
        """Add one output token; returns the finish reason it causes, if any."""
        if req.logprobs is not None:
            req.logprobs.append(logprob)
        req.output_token_ids.append(token)
        req.all_token_ids.append(token)
        if req.first_token_time is None:
            req.first_token_time = now
        params = req.params
        grammar = req.grammar
        if grammar is not None and not grammar.accept(token):
            req.error = (f"the grammar refused sampled token {token} ({grammar.error}): "
                         "the mask was not applied")
            return "error"
        if token in self.eos_token_ids and not params.ignore_eos:
            return "stop"
        if token in params.stop_token_ids:
            return "stop"
        if req.detok.add_token(token):
            return "stop"
        if grammar is not None and grammar.terminated:
            return "stop"  # the grammar is complete: only EOS could follow
        if len(req.all_token_ids) >= req.max_num_tokens:
            return "length"
        return None

    def _finish_for(self, req: Request, reason: str, new_token_ids: list[int]) -> RequestOutput:
        """Finish req for what its last token caused (an error: the grammar refused it,
        and that token is not reported)."""
        if reason == "error":
            return self._finish(req, "error", req.error, ERR_ENGINE, new_token_ids[:-1])
        return self._finish(req, reason, None, new_token_ids=new_token_ids)

    def _accept_run(self, req: Request, tokens: list[int], now: float,
                    logprobs: list[TokenLogprob] | None = None) -> RequestOutput:
        """A verification's tokens, in order; the first that finishes the request ends
        it there, exactly where plain decoding would have stopped."""
        for j, token in enumerate(tokens):
            reason = self._append_token(req, token, now, None if logprobs is None else logprobs[j])
            if reason is not None:
                return self._finish_for(req, reason, tokens[:j + 1])
        return RequestOutput.delta(req, tokens, req.detok.take_delta(False), logprobs)

    def _accept_token(self, req: Request, token: int, now: float,
                      logprob: TokenLogprob | None = None) -> RequestOutput:
        reason = self._append_token(req, token, now, logprob)
        if reason is not None:
            return self._finish_for(req, reason, [token])
        # NOTE: a delta: token_ids/text are the delta too (see RequestOutput)
        return RequestOutput.delta(req, [token], req.detok.take_delta(False),
                                   None if req.logprobs is None else [logprob])

    def _finish(self, req: Request, reason: str, error: str | None,
                error_code: str | None = None, new_token_ids: list[int] | None = None) -> RequestOutput:
        if self.spec is not None:
            self.spec.finished(req, completed=reason in ("stop", "length"))
        self.grammars.discard(req)  # if still compiling
        if req.params.uses_logits_processors and req.request_id in self.requests:
            self._num_processed -= 1
        self.scheduler.remove(req)
        self.runner.remove(req)
        self.requests.pop(req.request_id, None)
        return self._finish_output(req, reason, error, error_code, new_token_ids)

    def _finish_output(self, req: Request, reason: str, error: str | None,
                       error_code: str | None = None,
                       new_token_ids: list[int] | None = None) -> RequestOutput:
        req.status = RequestStatus.FINISHED
        req.finish_reason, req.error = reason, error
        req.finish_time = time.time()
        detok = req.detok
        if detok is None:  # refused before it had a detokenizer
            return RequestOutput.final(req, "", "", new_token_ids or [], error_code)
        # NOTE: the final text is decoded once from the final tokens (engine/detokenizer.py
        # output_text), never the deltas joined: the one text of these tokens on every path
        p = req.params
        text, stop_hit = output_text(self.tokenizer, detok.context, req.output_token_ids,
                                     p.stop, p.stop_token_ids, self.eos_token_ids, p.ignore_eos)
        return RequestOutput.final(req, detok.finish(text), text, new_token_ids or [],
                                   error_code, stop_hit)

    # -- offline use ------------------------------------------------------------------------
    def generate(self, prompts: Sequence[str] | Sequence[Sequence[int]],
                 params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[RequestOutput]:
        """Run prompts (texts or token-id lists) to completion; final outputs in input order."""
        params_list = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        ids = []
        for prompt, p in zip(prompts, params_list):
            rid = f"generate-{next(self._gen_ids)}"
            ids.append(rid)
            if isinstance(prompt, str):
                self.add_request(rid, prompt=prompt, params=p)
            else:
                self.add_request(rid, prompt_token_ids=list(prompt), params=p)
        finals: dict[str, RequestOutput] = {}
        wanted = set(ids)
        while len(finals) < len(ids):
            for out in self.step():
                if out.finished and out.request_id in wanted:
                    finals[out.request_id] = out
        return [finals[i] for i in ids]

    def score(self, prompts: Sequence[str] | Sequence[Sequence[int]]) -> list[ScoreOutput]:
        """Per-token logprobs of each text (or token-id list) under the model, computed by
        the engine's own forward (prompt logprobs, batched and chunked like any prefill):
        `ScoreOutput.logprobs[i]` = log p(token i | tokens before it), `.perplexity`."""
        params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, prompt_logprobs=0)
        outs = self.generate(prompts, params)
        for out in outs:
            if out.finish_reason == "error":
                raise ScoreError(f"cannot score a prompt of {out.num_prompt_tokens} tokens: {out.error}")
        return [ScoreOutput(list(o.prompt_token_ids),
                            [None] + [e.logprob for e in o.prompt_logprobs[1:]]) for o in outs]

    def stats(self) -> dict:
        out = self.counters.snapshot(self.kv, self.scheduler)
        out.update(self.grammars.stats())
        if self.lora is not None:
            out.update(self.lora.stats())
            out["lora_running"] = sorted({r.lora for r in self.scheduler.running if r.lora})
            out["lora_waiting"] = sorted({r.lora for r in self.scheduler.waiting if r.lora})
        if self.spec is not None:
            out.update(self.spec.stats.snapshot())
        return out
