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
    settings = make_settings(broker, url, tenant="pipeline-x")
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
    running = service.client.submit("a long answer", long, request_id=_rid("run"), timeout=4.0)
    # queued behind `running` in the engine (one at a time): never started by its deadline
    queued = service.client.submit("behind it", long, request_id=_rid("queued"), timeout=2.0)
    rows = wait_rows(service.store, [past, running, queued], timeout=90)
    for rid in (past, running, queued):
        assert rows[rid].status == "expired", rows[rid]
        assert rows[rid].finish_reason == "expired"
    assert rows[past].output_token_ids == [] and rows[past].usage["completion_tokens"] == 0
    assert rows[queued].output_token_ids == [] and rows[queued].usage["completion_tokens"] == 0
    n = len(rows[running].output_token_ids)
    assert 0 < n < 400 and rows[running].usage["completion_tokens"] == n
    assert rows[running].output  # what it produced is kept
    # one final row each (the upsert keeps the first final): the row is final and stays so
    time.sleep(0.5)
    again = service.store.get_requests([past, running, queued])
    assert {r: again[r].status for r in again} == {past: "expired", running: "expired",
                                                   queued: "expired"}
