"""Scheduler decisions on fake requests (no model): budget, fairness, preemption, blocks."""

from __future__ import annotations

from inflight.engine.kv_cache_manager import KVCacheManager
from inflight.engine.request import Request, RequestStatus
from inflight.engine.sampling_params import SamplingParams
from inflight.engine.scheduler import Scheduler


def make(num_blocks=64, block_size=4, max_num_seqs=8, budget=32, max_preemptions=8, caching=True):
    kv = KVCacheManager(num_blocks, block_size, caching)
    return Scheduler(kv, max_num_seqs, budget, max_preemptions)


_ids = iter(range(10**9))


def req(n_prompt, max_tokens=5, priority=0, first=1):
    i = next(_ids)
    return Request(f"r{i}", list(range(first + i * 1000, first + i * 1000 + n_prompt)),
                   SamplingParams(max_tokens=max_tokens, temperature=0), priority, arrival_index=i)


def step(s: Scheduler):
    """One fake engine step: advance computed tokens, sample token 7, finish at max_tokens."""
    out = s.schedule()
    for r in out.failed:
        r.status = RequestStatus.FINISHED
    for r, n in zip(out.requests, out.num_tokens):
        r.num_computed_tokens += n
        s.kv.cache_full_blocks(r)
        if r.num_computed_tokens == r.num_tokens:
            r.output_token_ids.append(7)  # as Engine._accept_token adds a sampled token
            r.all_token_ids.append(7)
            if r.num_output_tokens >= r.params.max_tokens:
                s.remove(r)
                r.status = RequestStatus.FINISHED
    s.kv.check_invariants(s.running + s.waiting)
    return out


def run(s: Scheduler, reqs, max_steps=1000):
    for r in reqs:
        s.add(r)
    outs = []
    while s.has_unfinished() and len(outs) < max_steps:
        outs.append(step(s))
    return outs


def test_budget_and_seq_limit_respected():
    s = make(max_num_seqs=4, budget=20)
    reqs = [req(n) for n in (3, 30, 7, 12, 25, 1, 9, 16)]
    for out in run(s, reqs):
        assert out.total_tokens <= 20
        assert len(out.requests) <= 4
        assert len(s.running) <= 4
    assert all(r.num_output_tokens == 5 for r in reqs)


def test_decodes_never_starved_by_long_prefill():
    s = make(budget=8, num_blocks=128)
    a = req(4, max_tokens=30)
    s.add(a)
    step(s)  # a prefilled, first token sampled
    s.add(req(200, max_tokens=2))  # a long prompt: 25 chunks of at most 7 tokens
    for _ in range(20):
        out = step(s)
        assert a in out.requests and out.num_tokens[out.requests.index(a)] == 1
        assert out.requests[0] is a  # decodes are placed first


def test_long_prompt_prefilled_over_several_steps():
    s = make(budget=10, num_blocks=64)
    r = req(45, max_tokens=1)
    outs = run(s, [r])
    assert [o.num_tokens for o in outs] == [[10], [10], [10], [10], [5]]


def test_all_blocks_return_to_pool_when_idle():
    s = make(num_blocks=40, budget=16, caching=False)
    run(s, [req(n, max_tokens=m) for n, m in ((5, 9), (17, 3), (2, 20), (11, 11), (30, 4))])
    assert s.kv.pool.num_free_blocks == 40 and s.kv.pool.num_used_blocks == 0


def test_waiting_admitted_by_priority_then_arrival():
    s = make(max_num_seqs=1)
    low, high_late, high_early = req(3, priority=5), req(3, priority=0), req(3, priority=0)
    for r in (low, high_late):
        s.add(r)
    s.add(high_early)  # same priority as high_late, later arrival index
    order = []
    while s.has_unfinished():
        out = step(s)
        for r in out.requests:
            if r not in order:
                order.append(r)
    assert order == [high_late, high_early, low]


def test_preemption_picks_lowest_priority_latest_and_recomputes():
    s = make(num_blocks=6, block_size=4, budget=64, max_num_seqs=4)
    a, b, c = req(8, max_tokens=6, priority=0), req(4, max_tokens=6, priority=1), req(4, max_tokens=6, priority=0)
    outs = run(s, [a, b, c])
    preempted = [r for o in outs for r in o.preempted]
    assert preempted and preempted[0] is b
    assert all(r.num_output_tokens == 6 for r in (a, b, c))
    assert s.kv.pool.num_used_blocks == 0


def test_preempted_too_often_fails():
    s = make(num_blocks=4, block_size=4, budget=64, max_preemptions=0)
    a, b = req(6, max_tokens=8), req(6, max_tokens=8)
    outs = run(s, [a, b])
    failed = [r for o in outs for r in o.failed]
    assert failed == [b] and a.num_output_tokens == 8


def test_whole_sequences_only_without_chunked_prefill():
    """An encoder's embedding requests (chunked_prefill=False) run whole: a sequence that does
    not fit what is left of the step's budget waits for the next step, in order."""
    kv = KVCacheManager(64, 4, False)
    s = Scheduler(kv, 8, 32, 8, chunked_prefill=False)
    a, b, c = req(20), req(20), req(8)
    for r in (a, b, c):
        s.add(r)
    out = s.schedule()
    assert out.requests == [a] and out.num_tokens == [20]  # b waits: 12 left, b needs 20
    for r in (a,):
        s.remove(r)
    out = s.schedule()
    assert out.requests == [b, c] and out.num_tokens == [20, 8]
