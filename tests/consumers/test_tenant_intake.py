"""The worker's intake and tenants, with the scripted fake engine of test_worker_logic on the
real broker: INFLIGHT_REQUIRE_TENANT refuses a request without a tenant, a request past its
deadline ends `expired` without reaching the engine, the tenant and deadline reach the engine,
the worker reads ahead of its in-flight limit, and the per-tenant token counters."""

from __future__ import annotations

import time

import pytest

from inflight.schemas import SamplingParams, decode_result
from tests.consumers.conftest import make_settings, read_topic
from tests.consumers.test_worker_logic import FakeEngine, _open, _spin, _stop

pytestmark = [pytest.mark.broker]


class KwEngine(FakeEngine):
    """FakeEngine that keeps the keywords each request was added with."""

    def __init__(self):
        super().__init__()
        self.kw: dict[str, dict] = {}

    def add_request(self, request_id, prompt=None, prompt_token_ids=None, params=None,
                    priority=0, **kw):
        self.kw[prompt] = kw
        super().add_request(request_id, prompt, prompt_token_ids, params, priority, **kw)


@pytest.fixture
def worker(broker, tmp_path):
    from inflight.producers.client import Client

    settings = make_settings(broker, f"sqlite:///{tmp_path / 'x.db'}", partitions=1,
                             worker_drain_timeout_s=2.0, require_tenant=True,
                             worker_read_ahead=5, tenant_metrics=True)
    engine = KwEngine()
    w = _open(settings, engine, max_inflight=3)
    client = Client(settings)
    yield settings, engine, w, client
    client.close()
    _stop(w)


def _finals(settings, n):
    recs = read_topic(settings, settings.topic_results,
                      until=lambda rs: sum(b'"status"' not in r.value for r in rs) >= n)
    events = [decode_result(r.value) for r in recs]
    return {e.request_id: e for e in events if e.type in ("final", "error")}


def test_intake_tenants_deadlines_and_read_ahead(worker):
    settings, engine, w, client = worker
    p = SamplingParams(max_tokens=1)
    client.submit("anon", p, request_id="anon")  # no tenant (INFLIGHT_TENANT unset)
    client.submit("late", p, request_id="late", tenant="t1", deadline=time.time() - 5)
    for i in range(8):  # 3 in flight + 5 read ahead: all 8 reach the engine
        client.submit(f"r{i}", p, request_id=f"r{i}", tenant="t1" if i % 2 else "t2",
                      timeout=600)
    _spin(w, lambda: len(engine.added) == 8)
    for _ in range(10):
        w.run_once()
    assert sorted(engine.added) == [f"r{i}" for i in range(8)]  # anon and late never ran
    assert engine.kw["r1"]["tenant"] == "t1" and engine.kw["r2"]["tenant"] == "t2"
    assert engine.kw["r1"]["deadline"] == pytest.approx(time.time() + 600, abs=30)
    engine.released |= {f"r{i}" for i in range(8)}
    _spin(w, lambda: not engine.requests and w.in_flight == 0)
    finals = _finals(settings, 10)
    assert finals["anon"].type == "error" and finals["anon"].field == "tenant"
    assert finals["anon"].code == "invalid_request"
    assert finals["late"].type == "final" and finals["late"].finish_reason == "expired"
    assert finals["late"].tenant == "t1" and finals["late"].token_ids == []
    assert finals["r1"].tenant == "t1" and finals["r1"].finish_reason == "length"
    text = w.metrics.prometheus()
    assert 'inflight_tenant_prompt_tokens_total{model_name=' in text
    assert 'tenant="t1"} 12.0' in text and 'tenant="t2"} 12.0' in text  # 4 requests x 3
