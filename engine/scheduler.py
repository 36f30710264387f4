"""In-flight batching: decide which tokens of which requests go into the next forward pass.

NOTE: there is no prefill phase and no decode phase. Each request's
`num_computed_tokens` catches up with its `num_tokens`; one step gives every chosen request
some number of new tokens within the step's token budget, so prefill chunks and
single-token decodes share one forward pass. Order within a step:

    1. running requests that decode (1 token each)  -- never starved by long prefills
    2. running requests still prefilling (a chunk each, as budget allows)
    3. waiting requests, by priority (lower value first) then arrival, while there are
       free sequence slots, budget and blocks (their cached prefix counts as computed)

Out of blocks while placing running requests: preempt the lowest-priority, latest running
request (free its blocks, put it back in the waiting queue to recompute). A request
preempted more than `max_preemptions` times fails instead of looping.

With output processing overlapped (one step ahead), the next step is scheduled before the
last one's tokens are known: a request's pending token counts as one to compute
(`Request.num_tokens_to_compute`), and the model runner feeds it from the device.

Speculative decoding: a decoding request with drafts (engine/spec/) gets 1 + len(drafts)
tokens, its last token and the drafts, verified in the same forward pass. Drafts are just
more tokens to compute: they count against the budget (cut to fit it) and get KV slots;
after verification the engine rolls the computed count back past the rejected ones.

`chunked_prefill=False` (an encoder's embedding requests: bidirectional attention needs the
whole sequence in one pass): a waiting request is admitted only when all its tokens fit
in what is left of the step's budget, and it never runs in chunks.

LoRA: a waiting request that names an adapter is admitted only once its adapter has a
slot (engine/lora/manager.py: `acquire`, which may load it or evict an idle one); with
every slot busy it waits and the requests behind it go on. It gives the slot back
(`release`) whenever it stops running: finished, aborted or preempted.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from inflight.engine.kv_cache_manager import KVCacheManager
from inflight.engine.request import Request, RequestStatus


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    """The plan for one step: `requests[i]` gets `num_tokens[i]` new tokens.

    NOTE: filled by `Scheduler.schedule` alone and read-only once returned: the engine
    and the runner read it and keep what they compute (a draft model's q, the step's
    inputs) to themselves."""

    requests: list[Request] = field(default_factory=list)
    num_tokens: list[int] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    failed: list[Request] = field(default_factory=list)  # preempted too often
    spec_token_ids: dict[Request, list[int]] = field(default_factory=dict)  # drafts to verify

    @property
    def total_tokens(self) -> int:
        return sum(self.num_tokens)

    @property
    def is_empty(self) -> bool:
        return not self.requests


class Scheduler:
    def __init__(self, kv: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int,
                 max_preemptions: int, chunked_prefill: bool = True, lora=None):
        """`lora`: the engine's LoraManager (engine/lora/manager.py), None without adapters."""
        self.kv = kv
        self.chunked_prefill = chunked_prefill
        self.lora = lora
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_preemptions = max_preemptions
        self.waiting: list[Request] = []  # sorted by Request.sort_key
        self.running: list[Request] = []
        self.num_preemptions = 0

    def add(self, req: Request) -> None:
        req.status = RequestStatus.WAITING
        bisect.insort(self.waiting, req, key=lambda r: r.sort_key)

    def remove(self, req: Request) -> None:
        """Take req out of the queues and free its blocks (finish or abort)."""
        if req.status is RequestStatus.RUNNING:
            self.running.remove(req)
            if self.lora is not None:
                self.lora.release(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.kv.free(req)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # -- one step -----------------------------------------------------------------------
    def schedule(self, drafts: dict[Request, list[int]] | None = None) -> SchedulerOutput:
        """`drafts`: proposed tokens of decoding requests, verified if they are placed."""
        out = SchedulerOutput()
        budget = self._schedule_running(out, self.max_num_batched_tokens, drafts or {})
        if not out.preempted:
            self._schedule_waiting(out, budget)
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int,
                          drafts: dict[Request, list[int]]) -> int:
        # Decodes (one token left to compute) first, then prefill chunks, each group in
        # `running` order: one pass that defers the prefills (no sort per step).
        prefills: list[Request] = []
        bs = self.kv.block_size
        requests, num_tokens = out.requests, out.num_tokens
        for req in self.running[:]:  # a copy: preemption removes from `running`
            n = req.num_tokens_to_compute
            if n == 1:
                spec = drafts.get(req) if drafts else None
                if not spec and req.num_computed_tokens < len(req.block_ids) * bs \
                        and req.status is RequestStatus.RUNNING:
                    # NOTE: most decodes: room in the blocks it holds (allocate_slots' own
                    # first test), so nothing to allocate and nobody to preempt
                    requests.append(req)
                    num_tokens.append(1)
                    budget -= 1
                else:
                    budget = self._place_running(req, 1 + len(spec) if spec else 1, out, budget)
                if spec and out.requests and out.requests[-1] is req:
                    n_spec = out.num_tokens[-1] - 1  # the budget may have cut the drafts
                    if n_spec:
                        out.spec_token_ids[req] = spec[:n_spec]
                if budget == 0:
                    return 0
            elif n > 1:
                prefills.append(req)
        for req in prefills:
            if budget == 0:
                break
            budget = self._place_running(req, req.num_tokens_to_compute, out, budget)
        return budget

    def _place_running(self, req: Request, n: int, out: SchedulerOutput, budget: int) -> int:
        """Give req min(n, budget) tokens, preempting others while blocks are short."""
        if req.status is not RequestStatus.RUNNING:  # preempted earlier in this step
            return budget
        n = min(n, budget)
        while not self.kv.allocate_slots(req, n):
            victim = max(self.running, key=lambda r: r.sort_key)
            budget += self._preempt(victim, out)
            if victim is req:
                return budget
        out.requests.append(req)
        out.num_tokens.append(n)
        return budget - n

    def _preempt(self, victim: Request, out: SchedulerOutput) -> int:
        """Preempt victim; return the budget it had been given this step (if any)."""
        refund = 0
        for i, r in enumerate(out.requests):
            if r is victim:
                refund = out.num_tokens.pop(i)
                out.requests.pop(i)
                out.spec_token_ids.pop(victim, None)
                break
        self.running.remove(victim)
        self.kv.free(victim)
        if self.lora is not None:
            self.lora.release(victim)
        victim.num_preemptions += 1
        self.num_preemptions += 1
        if victim.num_preemptions > self.max_preemptions:
            victim.status = RequestStatus.PREEMPTED
            out.failed.append(victim)
        else:
            out.preempted.append(victim)
            self.add(victim)
        return refund

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        in_flight = self.kv.hashes_in_flight(self.running)
        i = 0
        while i < len(self.waiting) and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[i]
            cached, num_cached = self.kv.find_cached_prefix(req)
            # NOTE: when the next block this request would compute is being computed right
            # now by a running request (a shared system prompt arriving in a burst), wait a
            # step and take it from the cache instead of computing it twice.
            if self.kv.next_block_in(req, len(cached), in_flight):
                i += 1
                continue
            if not self.chunked_prefill and req.num_tokens - num_cached > budget:
                break  # whole sequences only: it waits for a step with room
            if req.lora is not None and not self.lora.acquire(req):
                i += 1  # every adapter slot is in use: wait, let the others in
                continue
            n = min(req.num_tokens - num_cached, budget)
            if not self.kv.allocate_slots(req, n, cached):
                if req.lora is not None:
                    self.lora.release(req)
                break  # wait for blocks to free up; never preempt to admit
            self.kv.record_prefix_query(req.num_tokens, num_cached)
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = min(num_cached, req.num_prompt_tokens)
            self.waiting.pop(i)
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            in_flight |= self.kv.hashes_in_flight([req])
            out.requests.append(req)
            out.num_tokens.append(n)
            budget -= n
