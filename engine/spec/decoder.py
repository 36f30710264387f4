"""The engine's side of speculative decoding: who speculates in a step, how many drafts
each may get, and what the verification accepted (the counters of `Engine.stats()`).

A running request speculates in a step when all of these hold:

    - the step's running batch has at most `disable_by_batch_size` requests
      (above it the device is compute-bound: drafts cost more than they save);
    - its SamplingParams.speculative is True, or None and its priority is below
      `batch_priority` (batch work is compute-bound by design);
    - it has no structured output (a grammar would have to mask every draft position);
    - it is decoding (its computed tokens have caught up but for its last token) and
      has room: k is cut so that the last token a verification could emit is at most
      the request's last (max_tokens, context), so no K/V is computed past it;
    - drafts pay for themselves at its acceptance rate so far: it asks for the number
      of drafts that does (engine/spec/adaptive.py; none: it decodes plainly).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from inflight.engine.request import Request, RequestStatus
from inflight.engine.spec.adaptive import DraftLength
from inflight.engine.spec.config import SpeculativeConfig
from inflight.engine.spec.stats import SpecStats

if TYPE_CHECKING:
    from inflight.engine.device_step import StepHandle
    from inflight.engine.input_batch import InputBatch
    from inflight.engine.kv_cache_manager import KVCacheManager
    from inflight.engine.scheduler import SchedulerOutput


class Proposer(Protocol):
    """Drafts for each request, at most limits[i] tokens each (ngram.py, suffix.py, draft.py)."""

    def propose(self, reqs: list[Request], limits: list[int]) -> list[list[int]]: ...

    def finished(self, req: Request, completed: bool = True) -> None: ...


class SpecDecoder:
    def __init__(self, config: SpeculativeConfig, proposer: Proposer, costs: list[float]):
        """`proposer.propose(requests, limits) -> drafts per request` (engine/spec/ngram.py,
        suffix.py, draft.py); `proposer.finished(request, completed)` when one ends.
        `costs[d]`: what a verification of d drafts costs, in plain decode steps, d <= k
        (engine/spec/verify_costs.py, or adaptive.linear_costs for a fixed cost)."""
        self.config = config
        self.k = config.num_speculative_tokens
        self.proposer = proposer
        self.stats = SpecStats(self.k)
        self.lengths: dict[Request, DraftLength] = {}  # each speculating request's own
        if len(costs) != self.k + 1:
            raise ValueError(f"costs for 0..{self.k} drafts expected, got {len(costs)}")
        self.costs = costs

    def enabled_for(self, req: Request) -> bool:
        on = req.params.speculative
        return req.priority < self.config.batch_priority if on is None else on

    def may_speculate(self, running: list[Request]) -> bool:
        """Could a step over this running batch speculate at all? (Cheap: no proposals.)"""
        limit = self.config.disable_by_batch_size
        if not running or (limit is not None and len(running) > limit):
            return False
        # NOTE: logits processors run on one logits row per request: a batch with such a
        # request in it does not speculate (engine/logits_processors.py)
        if any(r.params.uses_logits_processors for r in running):
            return False
        return any(self.enabled_for(r) for r in running)

    def propose(self, running: list[Request]) -> dict[Request, list[int]]:
        """Drafts for the next step, by request (only those that got some)."""
        if not self.may_speculate(running):
            return {}
        reqs, limits = [], []
        for req in running:
            if req.status is not RequestStatus.RUNNING or req.num_pending or not req.output_token_ids:
                continue
            if req.num_tokens - req.num_computed_tokens != 1 or not self.enabled_for(req):
                continue
            if req.grammar is not None:  # each draft would need its own mask
                continue
            limit = min(self.k, req.max_num_tokens - req.num_tokens - 1)
            if limit <= 0:
                continue
            length = self.lengths.get(req)
            if length is None:
                length = self.lengths[req] = DraftLength()
            want = length.choose(limit, self.costs)
            if want:
                reqs.append(req)
                limits.append(want)
            else:
                length.idle()
        if not reqs:
            return {}
        drafts = self.proposer.propose(reqs, limits)
        return {r: d for r, d in zip(reqs, drafts) if d}

    def roll_back(self, sched: SchedulerOutput, handle: StepHandle, tokens: list[list[int]],
                  kv: KVCacheManager, batch: InputBatch) -> None:
        """After a verification step (`tokens`: what each sampler emitted): each request's
        computed count stops after its last accepted draft, so the K/V of rejected drafts
        is never read (the next step writes over those slots), and blocks holding only
        rejected tokens go back to the pool (`kv.trim`; the input batch forgets them).

        NOTE: blocks enter the prefix cache by `handle.seq_lens`, which for a request that
        verified drafts is set to its tokens known before the step: the accepted drafts'
        blocks are registered by the next step, once they are in `all_token_ids`, so the
        cache never hashes a block holding an unverified token."""
        spec = sched.spec_token_ids
        emitted = dict(zip(handle.samplers, tokens))
        for i, req in enumerate(handle.requests):
            drafts = spec.get(req)
            if drafts is None:
                continue
            num_out = len(emitted[req])
            self.record(req, len(drafts), num_out)
            req.num_computed_tokens -= len(drafts) + 1 - num_out
            handle.seq_lens[i] = req.num_tokens
            kv.trim(req)
            batch.truncate(req)

    def record(self, req: Request, num_drafts: int, num_emitted: int) -> None:
        """One request's verification: `num_drafts` checked, `num_emitted` tokens out."""
        self.stats.record(num_drafts, num_emitted - 1)
        length = self.lengths.get(req)
        if length is not None:
            length.observe(num_drafts, num_emitted - 1)

    def finished(self, req: Request, completed: bool) -> None:
        """req ended: forget it (`completed`: by stop or length, not abort or error)."""
        self.lengths.pop(req, None)
        self.proposer.finished(req, completed)
