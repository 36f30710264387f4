"""Turn a SchedulerOutput into device inputs, run one forward pass, sample on the device.

A launch has three parts, each its own function:

    StepInputs.build   one pass over the scheduled requests: rows, seq_lens, token ids,
                       who samples (engine/step_inputs.py)
    _pack              those into one int32 buffer, every region where `StepLayout` says
                       (engine/step_layout.py), sent in one copy
    _device_views      the same regions read back on the device as a `DeviceStep`

The flattened batch of one step (n scheduled requests in schedule order, T tokens):

    rows             [n]     each request's row in the persistent InputBatch
    seq_lens         [n]     computed tokens after this step
    input_ids        [T]     request 0's new tokens | request 1's | ...
    src              [T]     -1, or where the token is in the last step's sampled ids
    query_start_loc  [n+1]   where each request's tokens start in T
    (then block-table diffs, sampling settings, logprob rows, drafts: StepLayout)

These go to the device in one copy (engine/staging.py); the device derives the rest:

    block_tables  = block_table[rows]                       (the persistent table)
    token's request r = searchsorted(query_start_loc[1:], t, right=True)
    positions[t]  = seq_lens[r] - query_start_loc[r + 1] + t
    slot_mapping  = block_tables[r, pos // bs] * bs + pos % bs
    logits rows   = query_start_loc[1:] - 1                 (the last token of each request)

A request samples when this step brings its computed tokens up to all its tokens (the end
of a prefill, or a decode); a mid-prompt prefill chunk's sample is ignored. Steps where
every request decodes run padded on static buffers (engine/cuda_graphs.py: a CUDA graph
replay on CUDA). Host work per step is a loop over the scheduled requests (O(1) each for
a decode) and numpy copies; no per-token Python objects for decodes.

`execute(sched)` runs a step to the end. `launch(sched)` / `result(handle)` split it for
output processing overlapped with the next step: `launch` returns once the step is queued
on the device, `result` waits for its sampled ids (one device-to-host copy per step).

NOTE: launch/result order. On CUDA step k's sampled ids land in pinned buffer k % 2, read
by `result`; nothing but the order keeps launch k + 2 from overwriting step k's ids before
they are read. So at most one launched step may be unread when a step is launched, and
results are taken in launch order; anything else raises `StepOrderError` (a bug). All
device work goes on the engine's stream (engine/device.py) and the runner's events are
recorded on it. Nothing in a launch copies host data to the device but the one staged,
pinned copy (a synchronous pageable copy would stall the host until the device is idle).
"""

from __future__ import annotations

import logging
from collections import deque
from itertools import accumulate

import numpy as np
import torch

from inflight.engine.cuda_graphs import DecodeGraphs
from inflight.engine.device_step import (DeviceOutput, DeviceStep, DraftProbs, SpecInputs,
                                         StepHandle, StepOrderError)
from inflight.engine.input_batch import InputBatch
from inflight.engine.logprobs import LogprobRows, StepLogprobs, prompt_logprob_rows
from inflight.engine.lora.slots import LoraStep
from inflight.engine.model import AttentionMetadata, DecoderModel
from inflight.engine.request import Request
from inflight.engine.sampler import SamplingBatch, sample
from inflight.engine.scheduler import SchedulerOutput
from inflight.engine.spec.rejection import verify
from inflight.engine.staging import Staging
from inflight.engine.step_inputs import StepInputs
from inflight.engine.step_layout import StepLayout, region_len

log = logging.getLogger(__name__)


class ModelRunner:
    def __init__(self, model: DecoderModel, block_size: int, seed: int, *,
                 max_num_seqs: int = 64, max_num_batched_tokens: int = 2048,
                 cuda_graphs: bool = False, poison: bool = False,
                 stream: torch.cuda.Stream | None = None, draft: DecoderModel | None = None):
        """`cuda_graphs`: run decode-only steps padded on static buffers (recorded as CUDA
        graphs by `capture_graphs`, CUDA only; otherwise they run eagerly on the same
        buffers, and on CPU the block table and step inputs are kept in separate "device"
        buffers updated by diffs and copies, as on CUDA, so CPU tests run that logic too).
        `poison`: fill freed batch rows with an out-of-range block id (tests). `stream`:
        the engine's stream (CUDA), where the runner's events are recorded. `draft`: a
        speculative draft model (engine/spec/draft.py); every forward of the target runs it
        on the same inputs, so its KV cache (same blocks) holds what the target's does.
        The KV cache comes after (`allocate_kv_cache`): the engine sizes it by profiling
        a step on this runner first."""
        self.model = model
        self.block_size = block_size
        self.device = model.device
        self.cuda = self.device.type == "cuda"
        self.stream = stream if stream is not None or not self.cuda else \
            torch.cuda.current_stream(self.device)
        self.kv_caches: list[tuple[torch.Tensor, ...]] | None = None
        self.draft = draft
        self.draft_kv_caches: list[tuple[torch.Tensor, ...]] | None = None
        # the draft model's proposer (engine/spec/draft.py, set by build_spec_decoder): a
        # verification step reads the q of its last proposal
        self.drafter: DraftProbs | None = None
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        self.vocab_size = model.config.vocab_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        max_blocks = -(-model.max_model_len // block_size)
        separate = cuda_graphs or self.cuda
        self.batch = InputBatch(max_num_seqs, max_blocks, self.device, poison=poison,
                                shared=not separate)
        # room for a prompt-logprob step's extra rows too, so it needs no regrowth (a sync)
        self.staging = Staging(7 * max_num_seqs + 5 * max_num_batched_tokens + 64, self.device,
                               separate=separate, stream=self.stream)
        # the last step's sampled ids, by position in that step (inputs of pending decodes)
        self.sampled = torch.zeros(max_num_seqs, dtype=torch.int64, device=self.device)
        n_ar = max(max_num_seqs, max_num_batched_tokens) + 1
        self._arange32 = torch.arange(n_ar, dtype=torch.int32, device=self.device)
        self._arange64 = torch.arange(n_ar, dtype=torch.int64, device=self.device)
        if self.cuda:
            self._outs = [torch.zeros(max_num_seqs, dtype=torch.int64, pin_memory=True) for _ in range(2)]
        self._next_seq = 0          # launch number of the next step
        self._unread: deque[int] = deque()  # launched steps whose result was not taken yet
        self._prev_index: dict = {}
        self.num_device_fed = 0  # input tokens taken from the last step's samples (overlap)
        self._greedy = SamplingBatch(torch.empty(0), None, None, [], True)
        self.bitmasks = None  # engine.bitmask.BitmaskStage, set by enable_structured_outputs
        # engine.logits_processors.LogitsProcessors, set by enable_logits_processors
        self.procs = None
        self.graphs: DecodeGraphs | None = None
        if cuda_graphs:
            self.graphs = DecodeGraphs(max_num_seqs, self.device, self._decode_body, self.vocab_size)
            self.graphs.clear_inputs(self.batch.pad_row)

    # -- the KV cache and the graphs that read it ------------------------------------------
    def allocate_kv_cache(self, num_blocks: int) -> None:
        self.kv_caches = self.model.allocate_kv_cache(num_blocks, self.block_size)
        if self.draft is not None:
            self.draft_kv_caches = self.draft.allocate_kv_cache(num_blocks, self.block_size)

    def free_kv_cache(self) -> None:
        """Drop the KV cache (the profiling one); no graph may hold it."""
        if self.graphs is not None and self.graphs.graphs:
            raise RuntimeError("the KV cache is captured in CUDA graphs: it cannot be replaced")
        self.kv_caches = self.draft_kv_caches = None

    def capture_graphs(self) -> None:
        """Record the padded decode steps as CUDA graphs (on the final KV cache: a graph
        holds the addresses it was captured with)."""
        if self.graphs is None or self.kv_caches is None:
            raise RuntimeError("capture_graphs needs cuda_graphs=True and the KV cache allocated")
        self.graphs.capture(self.batch.pad_row)

    def enable_structured_outputs(self, compiler) -> None:
        """Buffers for the constrained sequences' token bitmasks (the first constrained
        request's admission; a runner without them never pays for them, nor imports the
        grammar engine)."""
        from inflight.engine.bitmask import BitmaskStage

        if self.bitmasks is None:
            self.bitmasks = BitmaskStage(compiler, self.max_num_seqs, self.device,
                                         separate=self.staging.separate, stream=self.stream)

    def enable_logits_processors(self, eos_token_ids) -> None:
        """Per-row state for penalties, biases and the like (the first request that uses
        one; a runner without them never pays for them)."""
        from inflight.engine.logits_processors import LogitsProcessors

        if self.procs is None:
            self.procs = LogitsProcessors(self.max_num_seqs, self.vocab_size, self.device,
                                          eos_token_ids)
            self.batch.procs = self.procs

    # -- the batch's rows ----------------------------------------------------------------
    def remove(self, req: Request) -> None:
        """req stopped running (finished, aborted, preempted): free its row."""
        self.batch.remove(req)

    # -- one step ------------------------------------------------------------------------
    def execute(self, sched: SchedulerOutput) -> tuple[StepHandle, list[int]]:
        """Run one step; return its handle (`samplers`: the requests that sampled, and any
        logprobs, resolved) and their new token ids."""
        handle = self.launch(sched)
        return handle, self.result(handle)

    def launch(self, sched: SchedulerOutput, overlapped: bool = False) -> StepHandle:
        """Queue one step on the device. With `overlapped`, the next launch may come before
        this step's result, feeding its pending tokens from the device."""
        if len(self._unread) > 1:
            raise StepOrderError(f"launch of step {self._next_seq} while steps {list(self._unread)} "
                                 "are unread: at most one step may be in flight unread (the "
                                 "sampled ids' pinned buffers are double, not deeper)")
        try:
            handle = self._launch(sched, overlapped, self._next_seq)
        except Exception:
            self.batch.resync()  # the step's block-table diffs may not have reached the device
            raise
        self._unread.append(handle.seq)
        self._next_seq += 1
        return handle

    @torch.inference_mode()
    def _launch(self, sched: SchedulerOutput, overlapped: bool, seq: int) -> StepHandle:
        inputs = StepInputs.build(sched, self.batch, self._prev_index)
        if inputs.spec is not None:
            if overlapped:
                raise StepOrderError("a verification step cannot be overlapped: its drafts are "
                                     "proposed from the tokens of the step before")
            if self.drafter is not None:
                inputs.draft_rows = self.drafter.prob_rows(sched.requests, sched.spec_token_ids)
        lora = self._plan_lora(inputs)
        packed = self._pack(inputs, lora)
        step = self._device_views(inputs, *packed)
        if lora is not None:
            lay, dev = packed[0], packed[1]
            if region_len(lay.lora_slots):  # the kernel reads each token's slot on the device
                lora.token_slots = dev[lay.lora_slots]
            step.lora = lora
        out = self.device_step(step)
        return self._handle(inputs, step, out, seq, overlapped)

    def _plan_lora(self, inputs: StepInputs) -> LoraStep | None:
        """Which tokens use which adapter slot (None: no request of the step has one)."""
        if self.model.lora is None:
            return None
        slots = [req.lora_slot for req in inputs.requests]
        if max(slots, default=-1) < 0:
            return None
        lora = self.model.lora
        return LoraStep.plan(slots, list(inputs.num_tokens), self.device, lora.dtype,
                             batch=not lora.kernel, native=lora.native is not None)

    def _padded_size(self, inputs: StepInputs, lora: LoraStep | None = None) -> int | None:
        """P when the step runs padded on the static decode buffers, else None: a step
        with prompt rows to score runs eagerly (the graphs return n rows only), and so
        does a verification step (T > n) and a step with adapters (engine/lora: the
        graphs hold no adapter slots)."""
        n = inputs.n
        if self.graphs is None or inputs.num_tokens_total != n or inputs.prompt_rows or lora is not None:
            return None
        return self.graphs.padded_size(n)

    def _pack(self, inputs: StepInputs, lora: LoraStep | None = None
              ) -> tuple[StepLayout, torch.Tensor, int | None, bool]:
        """Write the step's inputs into the staging buffer and send it: (layout, device
        buffer, P of a padded step or None, whether some row samples randomly)."""
        batch, n, T = self.batch, inputs.n, inputs.num_tokens_total
        P = self._padded_size(inputs, lora)
        lora_kernel = lora is not None and self.model.lora.kernel
        L, TL = P or n, P or T   # rows in the packed inputs (padded for a graph step)
        temp = top_k = top_p = None
        if batch.num_random:
            temp, top_k, top_p = batch.sampling_arrays(np.asarray(inputs.rows))
            if not temp.any():
                temp = top_k = top_p = None
        spec = inputs.spec
        R = len(inputs.prompt_at)
        lay = StepLayout.of(
            rows=L, seq_lens=L, ids=TL, src=TL, qsl=0 if P else n + 1,
            diffs=3 * batch.num_diff_entries, temperature=0 if temp is None else n,
            top_k=0 if top_k is None else n, top_p=0 if top_p is None else n,
            logprob_rows=len(inputs.lp_pos) * (1 if spec is None else spec.width + 1),
            prompt_rows=R, prompt_targets=R, spec=0 if spec is None else spec.size(n),
            draft_rows=0 if inputs.draft_rows is None else n, lora_slots=T if lora_kernel else 0)
        buf = self.staging.host(lay.size)
        _put(buf, lay.rows, inputs.rows, batch.pad_row)
        _put(buf, lay.seq_lens, inputs.seq_lens, 0)
        _put(buf, lay.ids, inputs.ids, 0)
        buf[lay.src] = -1
        if inputs.src_at:
            buf[lay.src.start + np.asarray(inputs.src_at)] = inputs.src_idx
            self.num_device_fed += len(inputs.src_at)
        if not P:
            buf[lay.qsl.start] = 0
            buf[lay.qsl.start + 1:lay.qsl.stop] = list(accumulate(inputs.num_tokens))
        if batch.num_diff_entries:
            batch.take_diffs(buf[lay.diffs])
        if temp is not None:
            buf[lay.temperature] = temp.view(np.int32)
            if top_k is not None:
                buf[lay.top_k] = np.where(top_k > 0, top_k, self.vocab_size)
            if top_p is not None:
                buf[lay.top_p] = top_p.view(np.int32)
        if inputs.lp_pos:
            W = 1 if spec is None else spec.width + 1  # logit rows per request
            buf[lay.logprob_rows] = inputs.lp_pos if W == 1 else \
                [i * W + j for i in inputs.lp_pos for j in range(W)]
        if R:
            buf[lay.prompt_rows] = inputs.prompt_at
            buf[lay.prompt_targets] = inputs.prompt_targets
        if spec is not None:
            spec.pack(buf, lay.spec.start)
            if inputs.draft_rows is not None:
                buf[lay.draft_rows] = inputs.draft_rows
        if lora_kernel:
            buf[lay.lora_slots] = np.repeat([req.lora_slot for req in inputs.requests], inputs.num_tokens)
        return lay, self.staging.send(lay.size), P, temp is not None

    def _device_views(self, inputs: StepInputs, lay: StepLayout, dev: torch.Tensor,
                      P: int | None, random: bool) -> DeviceStep:
        """The step's inputs as views of the staged copy on the device; block-table diffs
        applied, a padded step's inputs copied to the static buffers."""
        batch, n, T = self.batch, inputs.n, inputs.num_tokens_total
        if lay.diffs.stop > lay.diffs.start:
            batch.apply_diffs(dev[lay.diffs])
        procs = self.procs
        proc_rows = None
        if procs is not None and procs.active and inputs.spec is None:
            proc_rows = dev[lay.rows.start:lay.rows.start + n].long()
        step = DeviceStep(n, T, P, self._sampling(inputs, lay, dev, proc_rows) if random else self._greedy,
                          inputs.masked)
        if proc_rows is not None:
            step.proc_rows = proc_rows
            if len(inputs.sample_pos) != n:  # a mid-prompt chunk's sample is not an output token
                step.proc_samplers = torch.tensor(inputs.sample_pos, dtype=torch.long).to(
                    self.device, non_blocking=True)
        if inputs.lp_pos:
            step.logprob_rows = dev[lay.logprob_rows].long()
            step.logprob_top_n = max(r.params.logprobs for r in inputs.lp_reqs)
        if inputs.prompt_rows:
            step.prompt_rows = dev[lay.prompt_rows].long()
            step.prompt_targets = dev[lay.prompt_targets].long()
            step.prompt_top_n = max(r.params.prompt_logprobs for r, _, _ in inputs.prompt_rows)
        if P is not None:
            # rows | seq_lens | ids | src: back to back, P each (StepLayout)
            self.graphs.inputs[:, :P].copy_(dev[lay.rows.start:lay.src.stop].view(4, P))
            return step
        step.rows, step.seq_lens, step.qsl = dev[lay.rows], dev[lay.seq_lens], dev[lay.qsl]
        step.ids = dev[lay.ids]
        step.src = dev[lay.src] if inputs.src_at else None
        step.width = inputs.width
        spec = inputs.spec
        if spec is not None:
            step.logit_rows, vidx, drafts = spec.views(dev, lay.spec.start, n)
            q = None if inputs.draft_rows is None else \
                self.drafter.draft_probs(dev[lay.draft_rows].long(), spec.width)
            step.spec = SpecInputs(vidx, drafts, spec.num, q)
            step.masked = [(spec.first[i], m) for i, m in inputs.masked]
        return step

    def _sampling(self, inputs: StepInputs, lay: StepLayout, dev: torch.Tensor,
                  proc_rows: torch.Tensor | None = None) -> SamplingBatch:
        """Some row samples randomly: its settings, as device views.
        NOTE: a seeded request draws from its own generator only in the steps where it
        samples, so its draws do not depend on the rest of the batch."""
        gens: list[torch.Generator | None] = [None] * inputs.n
        for i, req in zip(inputs.sample_pos, inputs.samplers):
            if req.generator is not None:
                gens[i] = req.generator
        top_k = dev[lay.top_k].long() if region_len(lay.top_k) else None
        top_p = dev[lay.top_p].view(torch.float32) if region_len(lay.top_p) else None
        min_p = self.procs.min_p(proc_rows) if proc_rows is not None else None
        return SamplingBatch(dev[lay.temperature].view(torch.float32), top_k, top_p, gens, False,
                             min_p)

    def _handle(self, inputs: StepInputs, step: DeviceStep, out: DeviceOutput, seq: int,
                overlapped: bool) -> StepHandle:
        """The launched step's handle; its sampled ids on their way to the host (CUDA)."""
        n, samplers, spec = inputs.n, inputs.samplers, inputs.spec
        sampled = out.sampled
        handle = StepHandle(inputs.requests, samplers,
                            None if len(samplers) == n else inputs.sample_pos,
                            sampled if spec is None else sampled[:, 0], seq, list(inputs.seq_lens),
                            constrained=bool(inputs.masked))
        if spec is not None:
            handle.emitted = sampled
            sampled = sampled.reshape(-1).clamp(min=0)  # the target of each logit row
        if inputs.lp_pos or inputs.prompt_rows:
            handle.logprobs = StepLogprobs.build(
                inputs.lp_reqs, inputs.lp_pos, out.sample_logprobs, inputs.prompt_rows,
                out.prompt_logprobs, inputs.prompt_targets, width=1 if spec is None else spec.width + 1)
        if overlapped:
            self.sampled[:n].copy_(sampled)
            self._prev_index = {req: inputs.sample_pos[j] for j, req in enumerate(samplers)}
        if self.cuda and spec is None:
            # NOTE: step seq - 2 used this buffer; launch() checked that it was read
            host = self._outs[seq % 2]
            host[:n].copy_(sampled, non_blocking=True)
            handle.host_out = host
            handle.event = torch.cuda.Event()
            handle.event.record(self.stream)
        return handle

    def result(self, handle: StepHandle) -> list:
        """The sampled ids of `handle.samplers`, in order (waits for the device); for a
        verification step (`handle.emitted`) a list of 1..k+1 ids per sampler."""
        if not self._unread or self._unread[0] != handle.seq:
            raise StepOrderError(f"result of step {handle.seq} taken out of order (unread: "
                                 f"{list(self._unread)}): results come in launch order, once")
        self._unread.popleft()
        n = len(handle.requests)
        if handle.emitted is not None:
            tokens = [row[:row.index(-1)] if row[-1] < 0 else row for row in handle.emitted.tolist()]
        elif handle.event is not None:
            handle.event.synchronize()
            tokens = handle.host_out[:n].tolist()
        else:
            tokens = handle.sampled.tolist()
        if handle.logprobs is not None:
            handle.logprobs.resolve(handle.requests, tokens)
        if handle.sample_pos is None:
            return tokens
        return [tokens[i] for i in handle.sample_pos]

    # -- the device step: forward + sampling (what a profile calls "device work") -----------
    def device_step(self, step: DeviceStep) -> DeviceOutput:
        """The forward and the sampling of a step whose inputs are on the device.
        `step.masked`: (logits row, GrammarMatcher) of the constrained samplers; their rows
        are masked to what the grammar allows before sampling (engine/bitmask.py).
        A verification step (`step.spec`) -> emitted ids [n, K+1] and logits
        [n * (K+1), vocab]: engine/spec/rejection.py. Constrained requests never have
        drafts: `masked` names their one logit row (SpecLayout.first). The logprobs asked
        for are computed here too (engine/logprobs.py), on their rows only; the logits
        never leave (on CPU freeing a [n, vocab] fp32 tensor is an munmap: the forward's
        memory, not the host's bookkeeping)."""
        hidden = None
        if step.padded is not None:
            logits = self.graphs.run(step.padded)[:step.n]
        else:
            logits, hidden = self._eager_forward(step)
        if step.masked:
            self.bitmasks.apply(logits, step.masked)
        raw = logits  # what logprobs report: the model's (masked) logits
        if step.proc_rows is not None:  # never in a verification (SpecDecoder.may_speculate)
            logits = self.procs.apply(logits, step.proc_rows)
        spec = step.spec
        if spec is not None:
            logits = logits[spec.vidx]
            emitted = verify(logits, spec.drafts, spec.num_drafts, step.sampling, self.generator,
                             spec.draft_probs)
            logits = raw = logits.view(-1, logits.shape[-1])  # no processors here: raw is these rows
            sampled = targets = emitted
            if step.logprob_rows is not None:
                targets = emitted.reshape(-1).clamp(min=0)  # the target of each logit row
        else:
            sampled = targets = sample(logits, step.sampling, self.generator)
            if step.proc_rows is not None:
                at = step.proc_samplers
                self.procs.count(step.proc_rows if at is None else step.proc_rows[at],
                                 sampled if at is None else sampled[at])
        logits = raw
        out = DeviceOutput(sampled)
        rows = step.logprob_rows
        if rows is not None:
            out.sample_logprobs = LogprobRows.compute(logits[rows], targets[rows], step.logprob_top_n)
        if hidden is not None:
            out.prompt_logprobs = prompt_logprob_rows(self.model, hidden, step.prompt_targets,
                                                      step.prompt_top_n)
        return out

    def _eager_forward(self, step: DeviceStep) -> tuple[torch.Tensor, torch.Tensor | None]:
        """-> (logits of the sampling rows, hidden states of the prompt rows or None)."""
        n, T = step.n, step.T
        seq_lens, qsl, ids = step.seq_lens, step.qsl, step.ids
        if step.src is not None:
            src = step.src
            ids = torch.where(src >= 0, self.sampled[src.clamp(min=0)], ids)
        block_tables = self.batch.block_table_dev[step.rows, :max(step.width, 1)]
        t = self._arange64[:T]
        if T == n:  # decodes only: token i is request i's
            token_req = self._arange64[:n]
            positions = seq_lens.long() - 1
        else:
            token_req = torch.searchsorted(qsl[1:], t.to(torch.int32), right=True)
            positions = (seq_lens[token_req] - qsl[token_req + 1]).long() + t
        bs = self.block_size
        slots = block_tables[token_req, positions // bs].long() * bs + positions % bs
        meta = AttentionMetadata(slot_mapping=slots, block_tables=block_tables, seq_lens=seq_lens,
                                 query_start_loc=qsl, lora=step.lora)
        last = qsl[1:].long() - 1 if step.logit_rows is None else step.logit_rows
        if self.draft is not None:
            self._mirror(ids, positions, meta)
        if step.prompt_rows is None:
            return self.model.forward(ids, positions, meta, self.kv_caches, last), None
        h = self.model.forward_hidden(ids, positions, meta, self.kv_caches,
                                      torch.cat([last, step.prompt_rows]))
        R = last.shape[0]
        return self.model.compute_logits(h[:R]), h[R:]

    def _decode_body(self, inputs: torch.Tensor) -> torch.Tensor:
        """The padded decode forward on static buffers `inputs` [4, P] (see cuda_graphs.py)."""
        P = inputs.shape[1]
        rows, seq_lens, ids, src = inputs[0], inputs[1], inputs[2], inputs[3]
        ids = torch.where(src >= 0, self.sampled[src.clamp(min=0)], ids)
        block_tables = self.batch.block_table_dev[rows]
        positions = (seq_lens.long() - 1).clamp(min=0)
        bs = self.block_size
        slots = block_tables.gather(1, (positions // bs)[:, None])[:, 0].long() * bs + positions % bs
        slots = torch.where(seq_lens > 0, slots, -1)  # padding rows write no K/V
        meta = AttentionMetadata(slot_mapping=slots, block_tables=block_tables, seq_lens=seq_lens,
                                 query_start_loc=self._arange32[:P + 1])
        if self.draft is not None:
            self._mirror(ids, positions, meta)
        return self.model.forward(ids, positions, meta, self.kv_caches, self._arange64[:P])

    def _mirror(self, ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> None:
        """The draft model's forward on the target's inputs: its K/V at the same slots
        (no logits: one row is normed, as a forward must return something)."""
        self.draft.forward_hidden(ids, positions, meta, self.draft_kv_caches, self._arange64[:1])


def _put(buf: np.ndarray, region: slice, values: list[int], pad: int) -> None:
    """values, then `pad` to the region's end."""
    k = region.start + len(values)
    buf[region.start:k] = values
    buf[k:region.stop] = pad
