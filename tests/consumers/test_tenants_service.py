"""Tenants and deadlines through the whole path (client -> broker -> worker -> recorder ->
store) on SQLite and Postgres: the tenant is stored with the request and its result; a
request past its deadline ends `expired` without running; a running one stops at its
deadline with what it produced; each has exactly one final row."""

from __future__ import annotations

import time
import uuid

import pytest

from inflight.schemas import SamplingParams
from tests.consumers.conftest import Service, make_settings, migrated, slowed_engine, wait_rows

pytestmark = [pytest.mark.broker]

STEP_S = 0.02  # each engine step sleeps this long: a long request runs for seconds


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def service(request, broker, tiny_model, tmp_path_factory):
    from inflight.producers.client import Client
    from inflight.store import Store

    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('tenants') / 'inflight.db'}"
        store = Store(url, create=True)
    else:
        url = migrated(request.getfixturevalue("postgres_url"))
        store = Store(url)
    settings = make_settings(broker, url, tenant="pipeline-x", worker_read_ahead=200)
    # one request runs at a time: a second one waits in the engine's queue
    svc = Service(settings, slowed_engine(tiny_model, STEP_S, max_num_seqs=1), store)
    client = Client(settings, store=store)
    svc.client, svc.store = client, store
    try:
        yield svc
    finally:
        svc.stop()
        client.close()


def _rid(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex[:10]}"


def test_the_tenant_is_stored_with_the_request_and_its_result(service):
    a = service.client.submit("hello there", SamplingParams(max_tokens=3, temperature=0),
                              request_id=_rid("ta"), tenant="team-a")
    b = service.client.submit("hello there", SamplingParams(max_tokens=3, temperature=0),
                              request_id=_rid("tb"))  # the client's default (INFLIGHT_TENANT)
    rows = wait_rows(service.store, [a, b], timeout=60)
    assert rows[a].status == rows[b].status == "completed"
    assert rows[a].tenant == "team-a" and rows[b].tenant == "pipeline-x"


def test_deadlines_end_requests_expired_once(service):
    long = SamplingParams(max_tokens=400, temperature=0, ignore_eos=True)  # ~8 s of steps
    past = service.client.submit("too late", SamplingParams(max_tokens=4, temperature=0),
                                 request_id=_rid("past"), deadline=time.time() - 1)
    # one engine slot: whichever of the two the worker reads first runs until the deadline
    # they share, the other waits in the engine's queue and never starts
    deadline = time.time() + 3.0
    running = service.client.submit("a long answer", long, request_id=_rid("run"),
                                    deadline=deadline)
    queued = service.client.submit("behind it", long, request_id=_rid("queued"), timeout=60,
                                   deadline=deadline)
    rows = wait_rows(service.store, [past, running, queued], timeout=90)
    for rid in (past, running, queued):
        assert rows[rid].status == "expired", rows[rid]
        assert rows[rid].finish_reason == "expired"
    assert rows[past].output_token_ids == [] and rows[past].usage["completion_tokens"] == 0
    ran, waited = sorted((rows[running], rows[queued]), key=lambda r: -len(r.output_token_ids))
    assert waited.output_token_ids == [] and waited.usage["completion_tokens"] == 0
    n = len(ran.output_token_ids)
    assert 0 < n < 400 and ran.usage["completion_tokens"] == n
    assert ran.output  # what it produced is kept
    # one final row each (the upsert keeps the first final): the row is final and stays so
    time.sleep(0.5)
    again = service.store.get_requests([past, running, queued])
    assert {r: again[r].status for r in again} == {past: "expired", running: "expired",
                                                   queued: "expired"}


def test_a_small_tenant_is_served_through_another_tenants_flood(service):
    """B's few batch requests sit behind A's flood in the partitions: the worker reads ahead
    (INFLIGHT_WORKER_READ_AHEAD) and the engine serves B by fair share, not after A."""
    params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    flood = [_rid("A") for _ in range(40)]
    service.client.submit_many([{"prompt": "flood of work", "request_id": r} for r in flood],
                               params, priority=10, tenant="tenant-a", progress=False)
    small = [service.client.submit("small job", params, request_id=_rid("B"), priority=10,
                                   tenant="tenant-b") for _ in range(3)]
    rows = wait_rows(service.store, small, timeout=90)
    assert all(rows[r].status == "completed" for r in small), rows
    a_rows = service.store.get_requests(flood)
    done_a = sum(r.status == "completed" for r in a_rows.values())
    assert done_a <= 25, f"B waited for {done_a} of A's 40 requests"  # FCFS: all 40 first
    wait_rows(service.store, flood, timeout=90)
