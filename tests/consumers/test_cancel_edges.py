"""Requests queued while no worker runs, on the real broker, engine (tiny model) and SQLite:
a cancel sent meanwhile still ends the request `cancelled` once a worker starts (cancels
are read from a lookback window, not from the worker's start), and a second submission
of the same id with another prompt changes neither what runs nor the stored prompt."""

from __future__ import annotations

import time
import uuid

import pytest

from inflight.schemas import SamplingParams
from tests.consumers.conftest import Service, make_settings, tiny_engine, wait_rows

pytestmark = [pytest.mark.broker]


def _cancels(listener, want: set[str], timeout: float = 15.0) -> set[str]:
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    while not want <= seen and time.monotonic() < deadline:
        seen.update(c.request_id for c, _ in listener.poll())
        time.sleep(0.05)
    return seen


def test_listener_reads_the_lookback_window_only(broker, tmp_path):
    import orjson

    from inflight.consumers.cancel import CancelListener
    from inflight.producers.client import Client

    settings = make_settings(broker, f"sqlite:///{tmp_path / 'db.sqlite'}", partitions=1)
    old, new = f"old-{uuid.uuid4().hex[:6]}", f"new-{uuid.uuid4().hex[:6]}"
    with Client(settings) as client:
        client.producer.send(settings.topic_cancel, value=orjson.dumps({"request_id": old}),
                             timestamp_ms=int((time.time() - 7200) * 1000))  # 2 h ago
        client.cancel(new)
    default = CancelListener(settings)  # 24 h back: both
    try:
        assert _cancels(default, {old, new}) >= {old, new}
    finally:
        default.close()
    hour = CancelListener(settings.model_copy(update={"cancel_lookback_s": 3600}))
    try:
        assert _cancels(hour, {new}) == {new}
    finally:
        hour.close()


def test_cancel_sent_while_no_worker_ran_ends_the_queued_request_cancelled(broker, tiny_model,
                                                                          tmp_path):
    from inflight.engine import SamplingParams as EngineParams
    from inflight.producers.client import Client
    from inflight.store import Store

    url = f"sqlite:///{tmp_path / 'inflight.db'}"
    settings = make_settings(broker, url)
    store = Store(url, create=True)
    client = Client(settings, store=store)
    tag = uuid.uuid4().hex[:6]
    long = SamplingParams(max_tokens=400, ignore_eos=True, temperature=0)
    short = SamplingParams(max_tokens=8, temperature=0)
    cancelled = client.submit("red green blue", long, request_id=f"cancel-{tag}")
    neighbour = client.submit("one two three", short, request_id=f"keep-{tag}")
    twice = f"twice-{tag}"
    client.submit("the quick brown fox", short, request_id=twice)
    client.submit("a different prompt entirely", SamplingParams(max_tokens=3), request_id=twice)
    client.cancel(cancelled)  # no worker runs yet

    svc = Service(settings, tiny_engine(tiny_model), store)
    try:
        rows = wait_rows(store, [cancelled, neighbour, twice], timeout=60)
        assert {rid: r.status for rid, r in rows.items()} == {
            cancelled: "cancelled", neighbour: "completed", twice: "completed"}
        # the first submission is what ran and what the row says
        want = tiny_engine(tiny_model).generate(
            ["the quick brown fox"], [EngineParams(max_tokens=8, temperature=0)])[0]
        assert rows[twice].output_token_ids == want.token_ids
        # the prompt and params come with the request's queued event, on another topic than
        # its final: under load the recorder may store the final first
        deadline = time.monotonic() + 30
        while rows[twice].params is None and time.monotonic() < deadline:
            time.sleep(0.1)
            rows = store.get_requests([cancelled, neighbour, twice])
        assert (rows[twice].prompt, rows[twice].params["max_tokens"]) == ("the quick brown fox", 8)
    finally:
        svc.stop()
        client.close()
        store.close()
