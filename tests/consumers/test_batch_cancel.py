"""One cancel for a whole batch (`{"batch_id": ...}` on the cancel topic): its queued
requests end `cancelled` without running, its running ones are aborted, other requests are
untouched. Real broker, engine (tiny model, steps slowed), recorder, SQLite."""

from __future__ import annotations

import time
import uuid

import pytest

from inflight.schemas import PRIORITY_BATCH, SamplingParams
from tests.consumers.conftest import Service, make_settings, slowed_engine, wait_rows

pytestmark = [pytest.mark.broker]


def test_one_batch_cancel_ends_queued_and_running_requests(tiny_model, broker, tmp_path):
    from inflight.producers.client import Client
    from inflight.store import Store

    url = f"sqlite:///{tmp_path / 'inflight.db'}"
    store = Store(url, create=True)
    settings = make_settings(broker, url, partitions=2, worker_max_inflight=4)
    client = Client(settings, store=store)
    tag = uuid.uuid4().hex[:6]
    queued_batch, running_batch = f"bq-{tag}", f"br-{tag}"
    long = SamplingParams(max_tokens=400, ignore_eos=True, temperature=0)
    short = SamplingParams(max_tokens=4, temperature=0)
    # queued while no worker runs, cancelled before one starts: none of it may run
    queued = client.submit_many([f"one two {i}" for i in range(30)], short, progress=False,
                                batch_id=queued_batch, priority=PRIORITY_BATCH)
    client.cancel_batch_requests(queued_batch)
    keep = client.submit("red green blue", short)
    svc = Service(settings, slowed_engine(tiny_model, 0.01, max_num_seqs=4), store)
    try:
        rows = wait_rows(store, queued + [keep], timeout=90)
        assert {rows[i].status for i in queued} == {"cancelled"}
        assert rows[keep].status == "completed"
        assert svc.worker.metrics["admitted"] == 1       # only `keep` reached the engine
        # a batch whose requests run when its cancel comes: they are aborted
        running = client.submit_many([f"three four {i}" for i in range(3)], long,
                                     progress=False, batch_id=running_batch,
                                     priority=PRIORITY_BATCH)
        deadline = time.monotonic() + 60
        while svc.worker.in_flight < 3:
            assert time.monotonic() < deadline, svc.worker.metrics.summary()
            time.sleep(0.02)
        client.cancel_batch_requests(running_batch)
        rows = wait_rows(store, running, timeout=60)
        assert {rows[i].status for i in running} == {"cancelled"}
        assert all(rows[i].usage is None or rows[i].usage["completion_tokens"] < 400
                   for i in running)
    finally:
        svc.stop()
        client.close()
        store.close()


INFLIGHT = 8


def test_cancel_stops_the_batch_within_a_second(tiny_model, broker, db_url):
    """A running batch cancelled the way the API does it (batch_jobs.cancel_batch: the
    batch row to `cancelling`, then one batch cancel): of its requests, at most one
    worker's in-flight window completes more than 1 s after the cancel returned, on SQLite
    and Postgres (before the cancel reader had a thread of its own, a loaded worker kept
    admitting the batch's queued requests for seconds: docs/benchmarks.md)."""
    from inflight.producers import batch_jobs as jobs
    from inflight.producers.client import Client
    from inflight.store import Store

    store = Store(db_url, create=True)
    settings = make_settings(broker, db_url, partitions=2, worker_max_inflight=INFLIGHT)
    client = Client(settings, store=store)
    bid = f"batch_{uuid.uuid4().hex[:10]}"
    store.create_batch(bid, endpoint="/v1/completions", input_file_id=None)
    assert store.transition_batch(bid, "in_progress")
    ids = client.submit_many([f"one two {i}" for i in range(400)],
                             SamplingParams(max_tokens=8, ignore_eos=True, temperature=0),
                             progress=False, batch_id=bid, priority=PRIORITY_BATCH)
    svc = Service(settings, slowed_engine(tiny_model, 0.005, max_num_seqs=INFLIGHT), store)
    try:
        deadline = time.monotonic() + 90
        while store.count_by_status(bid)["completed"] < 3 * INFLIGHT:
            assert time.monotonic() < deadline, svc.worker.metrics.summary()
            time.sleep(0.05)
        jobs.cancel_batch(store, client, bid)
        returned = time.time()
        rows = wait_rows(store, ids, timeout=90)
        assert all(r.is_final for r in rows.values())
        done = [r.finished_at.timestamp() for r in rows.values() if r.status == "completed"]
        late = sum(t > returned + 1.0 for t in done)
        assert late <= INFLIGHT, (late, len(done))
        assert sum(r.status == "cancelled" for r in rows.values()) >= 400 - len(done)
        assert len(done) < 400 - 4 * INFLIGHT   # the cancel came while most were queued
    finally:
        svc.stop()
        client.close()
        store.close()
