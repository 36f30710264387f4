"""In-flight batching: decide which tokens of which requests go into the next forward pass.

NOTE: there is no prefill phase and no decode phase. Each request's
`num_computed_tokens` catches up with its `num_tokens`; one step gives every chosen request
some number of new tokens within the step's token budget, so prefill chunks and
single-token decodes share one forward pass. Order within a step:

    1. running requests that decode (1 token each)  -- never starved by long prefills
    2. running requests still prefilling (a chunk each, as budget allows)
    3. waiting requests, by priority class (lower value first, strictly), within a class
       by fair share (the tenant with the least weighted service, engine/fair_share.py;
       fairness off: one queue), within a tenant by deadline then arrival, while there
       are free sequence slots, budget and blocks (their cached prefix counts as computed)

Out of blocks while placing running requests: preempt a running request of the
lowest-priority class, from the tenant with the most weighted service (fairness off: any),
the latest to arrive (free its blocks, put it back in the waiting queue to recompute). A
request preempted more than `max_preemptions` times fails instead of looping.

Waiting requests live in one sorted list per (class, tenant): picking the next costs a
min over the class's waiting tenants, adding one a bisect in its tenant's list. With
fairness on, every scheduled token adds 1 / weight to its tenant's counter (one float
add per scheduled request per step).

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
from collections import Counter
from dataclasses import dataclass, field
from itertools import compress
from operator import attrgetter

from inflight.engine.fair_share import FairShare, TenantShare
from inflight.engine.kv_cache_manager import KVCacheManager
from inflight.engine.request import Request, RequestStatus

_service = attrgetter("service")
_share_of = attrgetter("share")
_ONE = 1
_queue_key = attrgetter("queue_key")


def _index(q: list[Request], req: Request) -> int:
    """req's position in its sorted queue, or -1."""
    i = bisect.bisect_left(q, req.queue_key, key=_queue_key)
    return i if i < len(q) and q[i] is req else -1


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
                 max_preemptions: int, chunked_prefill: bool = True, lora=None, *,
                 fair_share: bool = True, tenant_weights: tuple[tuple[str, float], ...] = ()):
        """`lora`: the engine's LoraManager (engine/lora/manager.py), None without adapters.
        `fair_share`: admit by tenant (module doc); False: by deadline then arrival within a
        class, whoever sent it (first come, first served)."""
        self.kv = kv
        self.chunked_prefill = chunked_prefill
        self.lora = lora
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_preemptions = max_preemptions
        self.fair = fair_share
        self.shares = FairShare(tenant_weights)
        # priority class -> tenant -> its waiting requests, sorted by Request.queue_key
        self._classes: dict[int, dict[TenantShare, list[Request]]] = {}
        self._priorities: list[int] = []  # the classes with waiting requests, most urgent first
        self.num_waiting = 0
        self.running: list[Request] = []
        self.num_preemptions = 0

    @property
    def waiting(self) -> list[Request]:
        """Every waiting request (a new list: tests, stats)."""
        return [r for p in self._priorities for q in self._classes[p].values() for r in q]

    def add(self, req: Request) -> None:
        """Queue a new request (its tenant becomes active: the lift rule)."""
        req.share = self.shares.share(req.tenant if self.fair else None)
        self.shares.join(req.share)
        self._queue(req)

    def _queue(self, req: Request) -> None:
        req.status = RequestStatus.WAITING
        queues = self._classes.get(req.priority)
        if queues is None:
            queues = self._classes[req.priority] = {}
            bisect.insort(self._priorities, req.priority)
        q = queues.get(req.share)
        if q is None:
            queues[req.share] = [req]
        else:
            bisect.insort(q, req, key=_queue_key)
        self.num_waiting += 1

    def _unqueue(self, req: Request, q: list[Request], i: int) -> None:
        q.pop(i)
        self.num_waiting -= 1
        if not q:
            queues = self._classes[req.priority]
            del queues[req.share]
            if not queues:
                del self._classes[req.priority]
                self._priorities.remove(req.priority)

    def remove(self, req: Request) -> None:
        """Take req out of the queues and free its blocks (finish or abort)."""
        if req.status is RequestStatus.RUNNING:
            self.running.remove(req)
            req.share.num_running -= 1
            self.shares.leave(req.share)
            if self.lora is not None:
                self.lora.release(req)
        elif req.status is RequestStatus.WAITING and req.share is not None:
            q = self._classes.get(req.priority, {}).get(req.share)
            i = _index(q, req) if q else -1
            if i >= 0:  # (a request still compiling its grammar is in no queue)
                self._unqueue(req, q, i)
                self.shares.leave(req.share)
        self.kv.free(req)

    def has_unfinished(self) -> bool:
        return bool(self.num_waiting or self.running)

    # -- one step -----------------------------------------------------------------------
    def schedule(self, drafts: dict[Request, list[int]] | None = None) -> SchedulerOutput:
        """`drafts`: proposed tokens of decoding requests, verified if they are placed."""
        out = SchedulerOutput()
        budget = self._schedule_running(out, self.max_num_batched_tokens, drafts or {})
        if self.fair:
            self._charge(out.requests, out.num_tokens)
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
            victim = max(self.running, key=self._victim_key)
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
        victim.share.num_running -= 1
        self.kv.free(victim)
        if self.lora is not None:
            self.lora.release(victim)
        victim.num_preemptions += 1
        self.num_preemptions += 1
        if victim.num_preemptions > self.max_preemptions:
            victim.status = RequestStatus.PREEMPTED
            self.shares.leave(victim.share)
            out.failed.append(victim)
        else:
            out.preempted.append(victim)
            self._queue(victim)
        return refund

    def _victim_key(self, req: Request) -> tuple:
        """Preempted first: the least urgent class, then (fair share) the tenant with the
        most weighted service, then the latest to arrive."""
        if self.fair:
            return (req.priority, req.share.service, req.arrival_index)
        return (req.priority, req.arrival_index)

    def _charge(self, requests: list[Request], num_tokens: list[int]) -> None:
        """The scheduled tokens of the running requests count as service to their tenants.

        NOTE: when every running request got a place this step (the usual case), one token
        each is charged per tenant from its count of running requests (O(tenants)), then
        the extra tokens of the few given more than one (prefill chunks, drafts), found in
        C (compress/filter); a Python loop over 256 running requests cost ~25 µs a step."""
        if len(requests) == len(self.running):
            for share in self.shares.active:
                if share.num_running:
                    share.service += share.num_running * share.inv_weight
        else:  # the budget ran out before every running request
            for share, k in Counter(map(_share_of, requests)).items():
                share.service += k * share.inv_weight
        if sum(num_tokens) != len(num_tokens):
            for req, n in zip(compress(requests, map(_ONE.__ne__, num_tokens)),
                              filter(_ONE.__ne__, num_tokens)):
                share = req.share
                share.service += (n - 1) * share.inv_weight

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        if not self.num_waiting or budget <= 0 or len(self.running) >= self.max_num_seqs:
            return
        in_flight = self.kv.hashes_in_flight(self.running)
        for priority in list(self._priorities):  # classes are strict: most urgent first
            queues = self._classes[priority]
            # each waiting tenant's next candidate (a request skipped this step stays queued)
            cursors = dict.fromkeys(queues, 0)
            while cursors:
                if budget <= 0 or len(self.running) >= self.max_num_seqs:
                    return
                share = min(cursors, key=_service) if len(cursors) > 1 else next(iter(cursors))
                q, i = queues[share], cursors[share]
                req = q[i]
                cached, num_cached = self.kv.find_cached_prefix(req)
                # NOTE: when the next block this request would compute is being computed
                # right now by a running request (a shared system prompt arriving in a
                # burst), wait a step and take it from the cache instead of computing it twice.
                if self.kv.next_block_in(req, len(cached), in_flight):
                    if i + 1 < len(q):
                        cursors[share] = i + 1
                    else:
                        del cursors[share]
                    continue
                if not self.chunked_prefill and req.num_tokens - num_cached > budget:
                    return  # whole sequences only: it waits for a step with room
                if req.lora is not None and not self.lora.acquire(req):
                    # every adapter slot is in use: wait, let the others in
                    if i + 1 < len(q):
                        cursors[share] = i + 1
                    else:
                        del cursors[share]
                    continue
                n = min(req.num_tokens - num_cached, budget)
                if not self.kv.allocate_slots(req, n, cached):
                    if req.lora is not None:
                        self.lora.release(req)
                    return  # wait for blocks to free up; never preempt to admit
                self.kv.record_prefix_query(req.num_tokens, num_cached)
                if req.num_cached_tokens < 0:
                    req.num_cached_tokens = min(num_cached, req.num_prompt_tokens)
                self._unqueue(req, q, i)
                if i >= len(q):  # (its queue may be gone: then so is its cursor)
                    cursors.pop(share, None)
                if self.fair:
                    share.service += n * share.inv_weight
                req.status = RequestStatus.RUNNING
                self.running.append(req)
                share.num_running += 1
                in_flight |= self.kv.hashes_in_flight([req])
                out.requests.append(req)
                out.num_tokens.append(n)
                budget -= n
