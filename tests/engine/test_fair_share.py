"""Fair share between tenants (virtual token counters) and deadlines: scheduler decisions
on fake requests, and deadlines on the tiny model."""

from __future__ import annotations

import time

import pytest

from inflight.engine import Engine, EngineConfig, SamplingParams
from inflight.engine.errors import ConfigError
from inflight.engine.fair_share import FairShare, parse_weights
from inflight.engine.kv_cache_manager import KVCacheManager
from inflight.engine.request import Request, RequestStatus
from inflight.engine.scheduler import Scheduler

_ids = iter(range(10**9))


def make(*, fair=True, weights=(), num_blocks=512, max_num_seqs=8, budget=64, block_size=4):
    kv = KVCacheManager(num_blocks, block_size, False)
    return Scheduler(kv, max_num_seqs, budget, 8, fair_share=fair, tenant_weights=weights)


def req(tenant, n_prompt=8, max_tokens=8, priority=0, deadline=None):
    i = next(_ids)
    return Request(f"r{i}", list(range(1 + i % 1000, 1 + i % 1000 + n_prompt)),
                   SamplingParams(max_tokens=max_tokens, temperature=0), priority,
                   arrival_index=i, tenant=tenant, deadline=deadline)


def step(s: Scheduler, served: dict | None = None, finished: list | None = None):
    """One fake engine step (as tests/engine/test_scheduler.py): tokens served per tenant."""
    out = s.schedule()
    for r, n in zip(out.requests, out.num_tokens):
        r.num_computed_tokens += n
        if served is not None:
            served[r.tenant] = served.get(r.tenant, 0) + n
        if r.num_computed_tokens == r.num_tokens:
            r.output_token_ids.append(7)
            r.all_token_ids.append(7)
            if r.num_output_tokens >= r.params.max_tokens:
                s.remove(r)
                r.status = RequestStatus.FINISHED
                if finished is not None:
                    finished.append(r)
    shares = s.shares.shares.values()
    assert sum(sh.num_running for sh in shares) == len(s.running)
    assert sum(sh.num_active for sh in shares) == len(s.running) + s.num_waiting
    return out


def test_weights_1_to_3_hold_within_10_percent_while_both_are_backlogged():
    s = make(weights=parse_weights({"a": 1, "b": 3}))
    # a sends big requests, b small ones: the split is in tokens, not requests
    for _ in range(300):
        s.add(req("a", n_prompt=24, max_tokens=16))
    for _ in range(600):
        s.add(req("b", n_prompt=6, max_tokens=6))
    served: dict = {}
    for _ in range(60):  # warm up: the running set turns over
        step(s)
    for _ in range(300):
        step(s, served)
        assert any(r.tenant == "a" for r in s.waiting) and any(r.tenant == "b" for r in s.waiting)
    ratio = served["b"] / served["a"]
    assert 3 * 0.9 <= ratio <= 3 * 1.1, served


def test_equal_weights_split_tokens_not_requests():
    s = make()
    for _ in range(200):
        s.add(req("big", n_prompt=30, max_tokens=10))
    for _ in range(1000):
        s.add(req("small", n_prompt=3, max_tokens=3))
    served: dict = {}
    for _ in range(40):
        step(s)
    for _ in range(150):
        step(s, served)
        assert {r.tenant for r in s.waiting} == {"big", "small"}
    assert 0.9 <= served["small"] / served["big"] <= 1.1, served


def test_an_idle_tenant_banks_no_credit():
    """b was idle while a ran alone: when b arrives it starts level with a (the lift
    rule), so it shares the engine from then on instead of taking all of it."""
    s = make()
    for _ in range(200):
        s.add(req("a", n_prompt=8, max_tokens=8))
    for _ in range(100):
        step(s)
    a_service = s.shares.share("a").service
    assert a_service > 0 and s.shares.share("b").service == 0
    for _ in range(100):
        s.add(req("b", n_prompt=8, max_tokens=8))
    assert s.shares.share("b").service >= a_service - 1e-9  # lifted to the active minimum
    served: dict = {}
    for _ in range(60):
        step(s, served)
    assert 0.8 <= served.get("b", 0) / served["a"] <= 1.25, served


def test_lift_floor_when_everyone_went_idle():
    fs = FairShare()
    a, b = fs.share("a"), fs.share("b")
    fs.join(a)
    a.service = 500.0
    fs.leave(a)
    fs.join(b)  # nobody active: b starts at the last active tenant's counter
    assert b.service == 500.0


def test_without_fairness_a_flood_is_served_first_come_first_served():
    s = make(fair=False, max_num_seqs=4)
    flood = [req("a") for _ in range(40)]
    late = [req("b") for _ in range(4)]
    for r in flood + late:
        s.add(r)
    finished: list = []
    while not any(r.tenant == "b" for r in finished):
        step(s, finished=finished)
    assert sum(r.tenant == "a" for r in finished) >= 36  # b waited behind the whole flood
    s2 = make(fair=True, max_num_seqs=4)
    for r in [req("a") for _ in range(40)] + [req("b") for _ in range(4)]:
        s2.add(r)
    finished = []
    while not any(r.tenant == "b" for r in finished):
        step(s2, finished=finished)
    assert sum(r.tenant == "a" for r in finished) <= 8


def test_priority_classes_stay_strict():
    s = make(max_num_seqs=2)
    batch = [req("a", priority=10) for _ in range(4)]
    for r in batch:
        s.add(r)
    step(s)  # a's batch work runs, so a has more service than b
    inter = [req("a", priority=0), req("b", priority=0)]
    more_batch = [req("b", priority=10)]
    for r in inter + more_batch:
        s.add(r)
    while any(r.status is not RequestStatus.FINISHED for r in batch[:2]):
        step(s)
    step(s)
    running = set(s.running)
    # both interactive requests are admitted before b's batch request, whoever has less service
    assert set(inter) <= running | {r for r in inter if r.status is RequestStatus.FINISHED}
    assert more_batch[0] not in running


def test_earlier_deadline_first_within_a_tenant():
    s = make(max_num_seqs=1)
    now = time.time()
    late, none, soon = req("a", deadline=now + 100), req("a"), req("a", deadline=now + 10)
    for r in (late, none, soon):
        s.add(r)
    out = s.schedule()
    assert out.requests == [soon]


def test_preemption_takes_the_tenant_with_most_service():
    # 6 blocks of 4 tokens: three requests of 8 prompt tokens hold all of them
    s = make(num_blocks=6, max_num_seqs=3)
    a1, b1, a2 = req("a", max_tokens=20), req("b", max_tokens=20), req("a", max_tokens=20)
    for r in (a1, b1, a2):
        s.add(r)
    s.shares.share("a").service += 1000  # a has had far more service than b
    preempted = []
    for _ in range(3):
        preempted += step(s).preempted
    assert preempted and all(r.tenant == "a" for r in preempted)


def test_weights_are_checked():
    assert parse_weights('{"b": 3, "a": 1}') == (("a", 1.0), ("b", 3.0))
    with pytest.raises(ConfigError, match="positive"):
        parse_weights({"a": 0})
    with pytest.raises(ConfigError, match="JSON"):
        parse_weights("{nope")


# -- deadlines on the tiny model --------------------------------------------------------
@pytest.fixture(scope="module")
def engine(tiny_model_path):
    return Engine(EngineConfig(model=tiny_model_path, num_kv_blocks=64, max_num_seqs=4,
                               tenant_weights={"x": 2}))


def test_a_request_past_its_deadline_never_runs(engine):
    engine.add_request("old", prompt_token_ids=[5, 6, 7], deadline=time.time() - 1,
                       params=SamplingParams(max_tokens=4, temperature=0))
    outs = [o for o in engine.step() if o.request_id == "old"]
    assert len(outs) == 1 and outs[0].finish_reason == "expired" and outs[0].token_ids == []
    assert not engine.has_unfinished()


def test_a_waiting_request_expires_unstarted_and_a_running_one_stops_with_its_tokens(engine):
    params = SamplingParams(max_tokens=400, temperature=0, ignore_eos=True)
    deadline = time.time() + 0.5
    engine.add_request("run", prompt_token_ids=[5, 6, 7], params=params, deadline=deadline,
                       tenant="x")
    for i in range(4):
        engine.add_request(f"fill{i}", prompt_token_ids=[9, 10, 11 + i], params=params)
    engine.add_request("queued", prompt_token_ids=[8, 9], params=params, deadline=deadline,
                       priority=10)  # behind the four others: never admitted before its deadline
    finals = {}
    t0 = time.monotonic()
    while "run" not in finals or "queued" not in finals:
        assert time.monotonic() - t0 < 30
        for o in engine.step():
            if o.finished:
                finals[o.request_id] = o
        # NOTE: at least 2 ms a step, so 400 tokens outlast the 0.5 s deadline on any box (the
        # tiny model alone runs ~3,000 steps a second once the CPU kernels use their threads)
        time.sleep(0.002)
    assert finals["queued"].finish_reason == "expired" and finals["queued"].token_ids == []
    run = finals["run"]
    assert run.finish_reason == "expired" and 0 < len(run.token_ids) < 400
    assert run.finish_time >= deadline
    for i in range(4):
        engine.abort(f"fill{i}")
    while engine.has_unfinished():
        engine.step()
