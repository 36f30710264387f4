"""A broker whose produce path stalls (every Kafka connection through a TCP proxy that
carries Produce requests holds its bytes, both ways) for twice max.poll.interval.ms while
the worker runs streaming requests: the publisher falls behind, the engine waits for it in
bounded slices, the intake stops admitting but keeps polling, so the worker is never put
out of its group, and every request still ends with exactly one completed row. Real
broker, engine (tiny model), recorder, SQLite."""

from __future__ import annotations

import threading
import time

import pytest

from inflight.schemas import SamplingParams
from tests.consumers.conftest import Service, make_settings, slowed_engine, wait_rows
from tests.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.broker]

MAX_POLL_INTERVAL_MS = 3000


def test_a_stalled_broker_causes_no_eviction_and_loses_nothing(tiny_model, tmp_path,
                                                               monkeypatch, request):
    from inflight.cli.broker import EmbeddedBroker, free_port
    from inflight.consumers import publisher
    from inflight.producers.client import Client
    from inflight.store import Store

    proxy_port = free_port()
    broker = EmbeddedBroker(log_path=tmp_path / "tansu.log", advertised_port=proxy_port).start()
    request.addfinalizer(broker.stop)
    proxy = TcpProxy(("127.0.0.1", broker.port), port=proxy_port)
    request.addfinalizer(proxy.cut)
    url = f"sqlite:///{tmp_path / 'inflight.db'}"
    store = Store(url, create=True)
    settings = make_settings(
        broker, url, partitions=2, worker_max_inflight=8,
        # a worker that fails to poll this long is put out of the group (kafka-python
        # leaves it itself); librdkafka wants the session no longer than this
        kafka_session_timeout_ms=MAX_POLL_INTERVAL_MS, kafka_heartbeat_interval_ms=500,
        kafka_max_poll_interval_ms=MAX_POLL_INTERVAL_MS,
        # a small producer queue: the publisher blocks in produce() during the stall
        kafka_rdkafka_options={"queue.buffering.max.messages": 50})
    # fewer steps in flight than the stall makes: the engine does wait for the publisher
    monkeypatch.setattr(publisher, "QUEUE_SIZE", 64)
    monkeypatch.setattr(publisher, "STEPS_BEHIND", 16)
    svc = Service(settings, slowed_engine(tiny_model, 0.005, max_num_seqs=8), store)
    w = svc.worker
    polls: list[float] = []
    poll = w.intake.consumer.poll

    def timed_poll(*a, **kw):
        polls.append(time.monotonic())
        return poll(*a, **kw)

    w.intake.consumer.poll = timed_poll
    seen = {"behind": 0, "waits": 0}
    done = threading.Event()

    def watch():
        while not done.is_set():
            seen["behind"] = max(seen["behind"], w.metrics["publisher_behind"])
            time.sleep(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    client = Client(settings, store=store)
    try:
        params = SamplingParams(max_tokens=300, ignore_eos=True, temperature=0)
        ids = client.submit_many([f"one two three {i}" for i in range(24)], params,
                                 progress=False)
        deadline = time.monotonic() + 120
        while w.metrics["completed"] < 2 or not w.in_flight:   # running, with more queued
            assert time.monotonic() < deadline, w.metrics.summary()
            time.sleep(0.02)
        stall_s = 2 * MAX_POLL_INTERVAL_MS / 1000
        rebalances = w.metrics["rebalances"]   # the first join counts one
        owned = set(w.intake.owned)
        proxy.stall(kafka_produce_only=True)
        stalled_at = time.monotonic()
        time.sleep(stall_s)
        proxy.resume()
        rows = wait_rows(store, ids, timeout=180)
        assert {r.status for r in rows.values()} == {"completed"} and len(rows) == len(ids)
        done.set()
        gaps = [b - a for a, b in zip(polls, polls[1:]) if b >= stalled_at]
        # the publisher fell behind: the engine waited, admission stopped ...
        assert w.engine_loop.publish_waits > 0 and seen["behind"] == 1
        # ... but the intake kept polling, so the worker stayed in the group
        assert max(gaps) < MAX_POLL_INTERVAL_MS / 1000 / 2, max(gaps)
        assert w.metrics["rebalances"] == rebalances and w.intake.owned == owned
        print(f"\nstall {stall_s:.0f}s: engine waited {w.engine_loop.publish_waits} slices, "
              f"longest gap between polls {max(gaps) * 1000:.0f} ms, no rebalance")
    finally:
        done.set()
        proxy.resume()
        svc.stop()
        client.close()
        store.close()
