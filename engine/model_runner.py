"""Turn a SchedulerOutput into device inputs, run one forward pass, sample on the device.

The flattened batch of one step (n scheduled requests in schedule order, T tokens):

    rows             [n]     each request's row in the persistent InputBatch
    seq_lens         [n]     computed tokens after this step
    input_ids        [T]     request 0's new tokens | request 1's | ...
    src              [T]     -1, or where the token is in the last step's sampled ids
    query_start_loc  [n+1]   where each request's tokens start in T
    (diffs)          3 x D   block-table updates (row, column, block id), CUDA only
    (sampling)       3 x n   temperature, top_k, top_p, when some row samples randomly

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
from dataclasses import dataclass
from itertools import accumulate

import numpy as np
import torch

from inflight.engine.cuda_graphs import DecodeGraphs
from inflight.engine.input_batch import InputBatch
from inflight.engine.logprobs import StepLogprobs
from inflight.engine.model import AttentionMetadata, LlamaModel
from inflight.engine.request import Request
from inflight.engine.sampler import SamplingBatch, sample
from inflight.engine.scheduler import SchedulerOutput
from inflight.engine.spec.layout import SpecLayout
from inflight.engine.spec.rejection import verify
from inflight.engine.staging import Staging

log = logging.getLogger(__name__)


@dataclass
class StepHandle:
    """A launched step: who samples, and where its sampled ids will be."""

    requests: list[Request]       # scheduled, in schedule order
    samplers: list[Request]       # those that sample, in schedule order
    sample_pos: list[int] | None  # their positions among `requests` (None: all sample)
    sampled: torch.Tensor         # [n] device
    seq: int                      # launch number (the launch/result order)
    seq_lens: list[int]           # each request's computed tokens once this step is done
    host_out: torch.Tensor | None = None  # pinned [n] (CUDA)
    event: torch.cuda.Event | None = None
    logprobs: StepLogprobs | None = None  # when a request asked for logprobs (resolved by result)
    emitted: torch.Tensor | None = None  # [n, K+1] a verification step's tokens (-1 padded)
    constrained: bool = False     # some sampler's tokens were masked by its grammar


class StepOrderError(RuntimeError):
    """A step was launched or read out of the order the pinned double buffers rely on."""


class ModelRunner:
    def __init__(self, model: LlamaModel, block_size: int, seed: int, *,
                 max_num_seqs: int = 64, max_num_batched_tokens: int = 2048,
                 cuda_graphs: bool = False, poison: bool = False,
                 stream: torch.cuda.Stream | None = None, draft: LlamaModel | None = None):
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
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        self.vocab_size = model.config.vocab_size
        self.max_num_seqs = max_num_seqs
        max_blocks = -(-model.max_model_len // block_size)
        separate = cuda_graphs or self.cuda
        self.batch = InputBatch(max_num_seqs, max_blocks, self.device, poison=poison,
                                shared=not separate)
        # room for a prompt-logprob step's extra rows too, so it needs no regrowth (a sync)
        self.staging = Staging(7 * max_num_seqs + 4 * max_num_batched_tokens + 64, self.device,
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
        reqs, ns = sched.requests, sched.num_tokens
        n = len(reqs)
        batch = self.batch
        row_of = batch.row_of
        prev = self._prev_index
        rows: list[int] = []
        seq_lens: list[int] = []
        ids: list[int] = []
        src_at: list[int] = []
        src_idx: list[int] = []
        samplers: list[Request] = []
        sample_pos: list[int] = []
        masked: list = []              # (logits row, GrammarMatcher) of constrained samplers
        lp_reqs: list[Request] = []    # samplers that asked for logprobs, and their rows
        lp_pos: list[int] = []
        prompt_rows: list[tuple[Request, int, int]] = []  # (req, start, stop): prompt logprobs
        prompt_at: list[int] = []      # their token rows in the step
        prompt_targets: list[int] = []  # the prompt token each of those rows scores
        drafts = sched.spec_token_ids
        layout = SpecLayout(drafts) if drafts else None
        if layout is not None and overlapped:
            raise StepOrderError("a verification step cannot be overlapped: its drafts are "
                                 "proposed from the tokens of the step before")
        width = 0
        pos = 0
        for i, (req, k) in enumerate(zip(reqs, ns)):
            row = row_of.get(req)
            if row is None:
                row = batch.add(req)
            elif len(req.block_ids) != batch.num_blocks[row]:
                batch.append_blocks(req, row)
            rows.append(row)
            start = req.num_computed_tokens
            end = start + k
            seq_lens.append(end)
            nb = batch.num_blocks[row]
            if nb > width:
                width = nb
            known = req.num_tokens
            spec = drafts.get(req) if layout is not None else None
            if layout is not None:
                layout.add(i, pos, k, spec)
            if spec:  # the last token, then the drafts to verify; it samples, as a decode
                ids.append(req.all_token_ids[start])
                ids += spec
                known = end
            elif end > known:  # the last input is the pending token of the step in flight
                ids += req.all_token_ids[start:known]
                ids.append(0)
                src_at.append(pos + k - 1)
                src_idx.append(prev[req])
            elif k == 1:
                ids.append(req.all_token_ids[start])
            else:
                ids += req.all_token_ids[start:end]
            if req.prompt_logprobs is not None and start < req.num_prompt_tokens - 1:
                stop = min(end, req.num_prompt_tokens - 1)  # rows start..stop-1 score a prompt token
                prompt_rows.append((req, start, stop))
                prompt_at.extend(range(pos, pos + stop - start))
                prompt_targets += req.prompt_token_ids[start + 1:stop + 1]
            pos += k
            if end == known + req.num_pending:
                samplers.append(req)
                sample_pos.append(i)
                if req.grammar is not None:
                    masked.append((i, req.grammar))
                if req.logprobs is not None:
                    lp_reqs.append(req)
                    lp_pos.append(i)
        T = pos
        graphs = self.graphs
        # a step with prompt rows to score runs eagerly (the graphs return n rows only), and
        # so does a verification step (T > n)
        P = graphs.padded_size(n) if graphs is not None and T == n and not prompt_rows else None
        L = P or n        # rows in the packed inputs (padded for a graph step)
        TL = P or T

        # -- pack: rows | seq_lens | ids | src | qsl | diffs | sampling | logprob rows ------
        d = batch.num_diff_entries
        random = batch.num_random > 0
        R = len(prompt_at)
        W = layout.width + 1 if layout is not None else 1  # logit rows per request in `sampled`
        lp_rows = lp_pos if W == 1 else [i * W + j for i in lp_pos for j in range(W)]
        buf = self.staging.host(2 * L + 2 * TL + n + 1 + 3 * d + 3 * n + len(lp_rows) + 2 * R +
                                (layout.size(n) if layout is not None else 0))
        buf[:n] = rows
        buf[n:L] = batch.pad_row
        buf[L:L + n] = seq_lens
        buf[L + n:2 * L] = 0
        o = 2 * L
        buf[o:o + T] = ids
        buf[o + T:o + TL] = 0
        o += TL
        buf[o:o + TL] = -1
        if src_at:
            buf[o + np.asarray(src_at)] = src_idx
            self.num_device_fed += len(src_at)
        o += TL
        o_qsl = o
        if P is None:
            buf[o] = 0
            buf[o + 1:o + n + 1] = list(accumulate(ns))
            o += n + 1
        o_diff = o
        d = batch.take_diffs(buf[o:])
        o += 3 * d
        o_samp = o
        temp = top_k = top_p = None
        if random:
            temp, top_k, top_p = batch.sampling_arrays(buf[:n])
            if temp.any():
                buf[o:o + n] = temp.view(np.int32)
                o += n
                if top_k is not None:
                    top_k = np.where(top_k > 0, top_k, self.vocab_size)
                    buf[o:o + n] = top_k
                    o += n
                if top_p is not None:
                    buf[o:o + n] = top_p.view(np.int32)
                    o += n
            else:
                random = False
        o_lp = o  # logits rows of the logprob samplers | prompt rows | their target tokens
        n_lp = len(lp_rows)
        buf[o:o + n_lp] = lp_rows
        o += n_lp
        buf[o:o + R] = prompt_at
        buf[o + R:o + 2 * R] = prompt_targets
        o += 2 * R
        o_spec = o
        if layout is not None:
            o = layout.pack(buf, o)
        dev = self.staging.send(o)

        # -- device work ----------------------------------------------------------------
        if d and not batch.shared:
            r = dev[o_diff:o_diff + d].long()
            c = dev[o_diff + d:o_diff + 2 * d].long()
            batch.block_table_dev[r, c] = dev[o_diff + 2 * d:o_diff + 3 * d]
        sampling = self._greedy
        if random:
            # NOTE: a seeded request draws from its own generator only in the steps where
            # it samples, so its draws do not depend on the rest of the batch
            gens: list = [None] * n
            for i, req in zip(sample_pos, samplers):
                if req.generator is not None:
                    gens[i] = req.generator
            o = o_samp
            t_temp = dev[o:o + n].view(torch.float32)
            o += n
            t_k = t_p = None
            if top_k is not None:
                t_k = dev[o:o + n].long()
                o += n
            if top_p is not None:
                t_p = dev[o:o + n].view(torch.float32)
            sampling = SamplingBatch(t_temp, t_k, t_p, gens, False)
        spec_inputs = None
        if P is not None:
            self.graphs.inputs[:, :P].copy_(dev[:4 * P].view(4, P))
            step_inputs = (P, None)
        else:
            extra = dev[o_lp + n_lp:o_lp + n_lp + R].long() if R else None
            logit_rows = None
            if layout is not None:
                logit_rows, vidx, spec_drafts = layout.views(dev, o_spec, n)
                spec_inputs = (vidx, spec_drafts, layout.num, sched.draft_probs)
                masked = [(layout.first[i], m) for i, m in masked]
            step_inputs = (None, (dev, n, T, width, o_qsl, bool(src_at), extra, logit_rows))
        sampled, logits, prompt_hidden = self.device_step(step_inputs, n, sampling, masked, spec_inputs)

        handle = StepHandle(reqs, samplers, None if len(samplers) == n else sample_pos,
                            sampled if layout is None else sampled[:, 0], seq, seq_lens,
                            constrained=bool(masked))
        if layout is not None:
            handle.emitted = sampled
            sampled = sampled.reshape(-1).clamp(min=0)  # the target of each logit row
        if lp_pos or prompt_rows:
            at = o_lp + n_lp
            handle.logprobs = StepLogprobs.compute(
                self.model, logits, sampled, lp_reqs, lp_pos, dev[o_lp:at].long(), prompt_rows,
                prompt_hidden, prompt_targets, dev[at + R:at + 2 * R].long(), width=W)
        if overlapped:
            self.sampled[:n].copy_(sampled)
            self._prev_index = {req: sample_pos[j] for j, req in enumerate(samplers)}
        if self.cuda and layout is None:
            # NOTE: step seq - 2 used this buffer; launch() checked that it was read
            out = self._outs[seq % 2]
            out[:n].copy_(sampled, non_blocking=True)
            handle.host_out = out
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
    def device_step(self, step_inputs, n: int, sampling: SamplingBatch, masked: list = (), spec=None):
        """-> (sampled ids [n], logits [n, vocab], hidden states of the extra prompt rows or None).
        `masked`: (logits row, GrammarMatcher) of the constrained samplers; their rows are
        masked to what the grammar allows before sampling (engine/bitmask.py).
        A verification step (`spec`: vidx [n, K+1], drafts [n, K], drafts per request, draft
        probabilities) -> (emitted ids [n, K+1], logits [n * (K+1), vocab], ...):
        engine/spec/rejection.py. Constrained requests never have drafts: `masked` names
        their one logit row (SpecLayout.first)."""
        P, eager = step_inputs
        hidden = None
        if P is not None:
            logits = self.graphs.run(P)[:n]
        else:
            logits, hidden = self._eager_forward(*eager)
        if masked:
            self.bitmasks.apply(logits, masked)
        if spec is not None:
            vidx, drafts, num_drafts, draft_probs = spec
            logits = logits[vidx]
            emitted = verify(logits, drafts, num_drafts, sampling, self.generator, draft_probs)
            return emitted, logits.view(-1, logits.shape[-1]), hidden
        return sample(logits, sampling, self.generator), logits, hidden

    def _eager_forward(self, dev: torch.Tensor, n: int, T: int, width: int, o_qsl: int,
                       has_src: bool, extra: torch.Tensor | None = None,
                       logit_rows: torch.Tensor | None = None):
        rows = dev[:n]
        seq_lens = dev[n:2 * n]
        ids = dev[2 * n:2 * n + T]
        if has_src:
            src = dev[2 * n + T:2 * n + 2 * T]
            ids = torch.where(src >= 0, self.sampled[src.clamp(min=0)], ids)
        qsl = dev[o_qsl:o_qsl + n + 1]
        block_tables = self.batch.block_table_dev[rows, :max(width, 1)]
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
                                 query_start_loc=qsl)
        last = qsl[1:].long() - 1 if logit_rows is None else logit_rows
        if self.draft is not None:
            self._mirror(ids, positions, meta)
        if extra is None:
            return self.model.forward(ids, positions, meta, self.kv_caches, last), None
        h = self.model.forward_hidden(ids, positions, meta, self.kv_caches, torch.cat([last, extra]))
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
