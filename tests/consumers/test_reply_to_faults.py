"""reply_to under kill -9 of a worker process: every request ends with exactly one final per
attempt on its reply topic, the same finals (attempt for attempt) as on the shared results
topic; redone attempts included, nothing lost. Real broker, real engine, SQLite."""

from __future__ import annotations

import json
import signal
import time
from collections import Counter

import pytest

from inflight.schemas import SamplingParams
from tests.consumers.conftest import Service, make_settings, migrated, read_topic, wait_rows
from tests.consumers.test_contract_wire import _create_topic
from tests.consumers.test_faults import _worker_process

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def _finals(recs) -> Counter:
    """(request id, attempt) of every final/error event, counted."""
    out = Counter()
    for r in recs:
        ev = json.loads(r.value)
        if ev["type"] in ("final", "error"):
            out[(ev["request_id"], ev["attempt"])] += 1
    return out


def test_kill9_each_request_gets_one_final_per_attempt_on_its_reply_topic(broker, tiny_model,
                                                                          tmp_path):
    from inflight.producers.client import Client
    from inflight.store import Store

    url = migrated(f"sqlite:///{tmp_path / 'inflight.db'}")
    settings = make_settings(broker, url, worker_max_inflight=4)
    reply = f"{settings.topic_results}.replies"
    _create_topic(settings, reply)
    store = Store(url)
    recorder = Service(settings, None, store, worker=False)
    client = Client(settings, store=store)
    log = tmp_path / "worker.log"
    params = SamplingParams(max_tokens=200, ignore_eos=True, temperature=0)
    items = [{"prompt": f"one two {w}", "reply_to": reply, "stream": i % 2 == 0}
             for i, w in enumerate("red green blue yellow purple orange black white".split())]
    ids = client.submit_many(items, params)
    first = _worker_process(settings, tiny_model, log)
    second = None
    try:
        deadline = time.monotonic() + 60
        while sum(r.status == "completed" for r in store.get_requests(ids).values()) < 1:
            assert time.monotonic() < deadline and first.poll() is None, log.read_text()[-3000:]
            time.sleep(0.05)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        rows = store.get_requests(ids)
        assert any(rows.get(i) is None or rows[i].status != "completed" for i in ids), (
            "everything finished before the kill; the test proves nothing")
        second = _worker_process(settings, tiny_model, log)
        rows = wait_rows(store, ids, timeout=120)
        assert {r.status for r in rows.values()} == {"completed"}, log.read_text()[-3000:]

        shared = [r for r in read_topic(settings, settings.topic_results,
                                        until=lambda rs: {r.key.decode() for r in rs
                                                          if b'"final"' in r.value} >= set(ids),
                                        timeout=30)
                  if r.key.decode() in ids]
        want = _finals(shared)
        replies = read_topic(settings, reply, until=lambda rs: len(_finals(rs)) >= len(want),
                             timeout=30)
        got = _finals(replies)
        assert set(got.values()) == {1}, got              # never twice for one attempt
        assert got == want                               # the same finals as the shared topic
        assert {rid for rid, _ in got} == set(ids)        # every request has its final there
        # byte for byte the shared topic's final of the same attempt, keyed by request id
        finals = lambda recs: {r.value for r in recs if b'"type":"final"' in r.value}  # noqa: E731
        assert finals(replies) == finals(shared)
        assert all(r.key == json.loads(r.value)["request_id"].encode() for r in replies)
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.kill()
        recorder.stop()
        client.close()
        store.close()
