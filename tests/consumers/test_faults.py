"""Failures on the real path: kill -9 of a worker process, the database going away under
the recorder, a 5,000-message backlog. Real broker, real engine (tiny model), real DBs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import orjson

import pytest

from inflight.schemas import SamplingParams
from tests.consumers.conftest import (Service, create_topic, make_settings, migrated,
                                      read_topic, results_by_request, tiny_engine, wait_rows)
from tests.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.broker, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def _worker_process(settings, model: Path, log: Path) -> subprocess.Popen:
    from inflight.cli.commands import settings_env

    env = {**os.environ, **settings_env(settings), "OMP_NUM_THREADS": "1", "INFLIGHT_METRICS_INTERVAL_S": "1",
           "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "inflight", "worker", "--model", str(model)],
                            env=env, cwd=REPO, stdout=open(log, "ab"), stderr=subprocess.STDOUT)


def _then_more(done, polls: int = 5):
    """read_topic's `until`: true `polls` polls after `done` first is."""
    seen = []

    def until(recs) -> bool:
        if seen or done(recs):
            seen.append(1)
        return len(seen) > polls

    return until


def test_kill9_worker_mid_run_every_request_ends_with_one_final_row(broker, tiny_model, db_url,
                                                                    tmp_path):
    from inflight.producers.client import Client
    from inflight.store import Store

    url = migrated(db_url)
    settings = make_settings(broker, url, worker_max_inflight=4)
    # every request also names a reply_to topic (docs/kafka-contract.md): its finals there
    # must be the shared topic's, attempt for attempt, none twice
    reply = f"{settings.topic_results}.replies"
    create_topic(settings, reply)
    store = Store(url)
    recorder = Service(settings, None, store, worker=False)
    client = Client(settings, store=store)
    log = tmp_path / "worker.log"
    params = SamplingParams(max_tokens=400, ignore_eos=True, temperature=0)
    prompts = [f"one two three {w}" for w in "red green blue yellow purple orange black white".split()] * 3
    ids = client.submit_many([{"prompt": p, "reply_to": reply, "stream": i % 2 == 0}
                              for i, p in enumerate(prompts)], params)
    first = _worker_process(settings, tiny_model, log)
    try:
        deadline = time.monotonic() + 60
        while True:  # let some requests finish, with others in flight
            done = sum(r.status == "completed" for r in store.get_requests(ids).values())
            if done >= 2:
                break
            assert time.monotonic() < deadline and first.poll() is None, (
                log.read_text()[-3000:] + recorder.recorder.metrics.summary())
            time.sleep(0.05)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        rows = store.get_requests(ids)
        unfinished = [i for i in ids if rows.get(i) is None or rows[i].status != "completed"]
        assert unfinished, "everything finished before the kill; the test proves nothing"

        second = _worker_process(settings, tiny_model, log)
        try:
            rows = wait_rows(store, ids, timeout=120)
            assert len(rows) == len(ids)                       # none lost
            assert {r.status for r in rows.values()} == {"completed"}
            want = {p: out.token_ids for p, out in zip(prompts, tiny_engine(tiny_model).generate(
                prompts[:8], [__import__("inflight.engine", fromlist=["SamplingParams"]).SamplingParams(max_tokens=400, ignore_eos=True,
                                                                  temperature=0)] * 8))}
            for rid, prompt in zip(ids, prompts):
                assert rows[rid].output_token_ids == want[prompt]   # a redo is not corrupted
                assert rows[rid].usage["completion_tokens"] == 400
            events = results_by_request(settings, set(ids))
            finals = {rid: sum(e.type == "final" for e in evs) for rid, evs in events.items()}
            assert all(finals[i] >= 1 for i in ids)
            # graceful stop of the survivor: SIGTERM -> drain, commit, leave the group, exit 0
            second.send_signal(signal.SIGTERM)
            assert second.wait(30) == 0, log.read_text()[-3000:]
            # (after the stop: no final of a redone attempt is still on its way; each read
            # goes on for a few polls past what it waits for, to see any extra copy)
            finals_of = lambda recs: Counter(  # noqa: E731
                (r.key.decode(), orjson.loads(r.value)["attempt"]) for r in recs
                if b'"type":"final"' in r.value and r.key.decode() in ids)
            shared = finals_of(read_topic(settings, settings.topic_results, timeout=30,
                                          until=_then_more(lambda rs: {k for k, _ in finals_of(rs)}
                                                           >= set(ids))))
            got = finals_of(read_topic(settings, reply, timeout=30,
                                       until=_then_more(lambda rs: sum(finals_of(rs).values())
                                                        >= sum(shared.values()))))
            assert got == shared and set(got.values()) == {1}, (got, shared)
        finally:
            if second.poll() is None:
                second.kill()
    finally:
        if first.poll() is None:
            first.kill()
        recorder.stop()
        client.close()
        store.close()


@pytest.mark.postgres
def test_database_outage_under_the_recorder_loses_nothing(broker, tiny_model, postgres_url):
    from inflight.consumers.recorder import Recorder
    from inflight.producers.client import Client
    from sqlalchemy.engine import make_url
    from inflight.store import Store

    url = migrated(postgres_url)
    u = make_url(url)
    proxy = TcpProxy((u.host or "127.0.0.1", u.port or 5432))
    proxied = u.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    settings = make_settings(broker, url)
    direct = Store(url)
    svc = Service(settings, tiny_engine(tiny_model), Store(proxied))
    client = Client(settings, store=direct)
    p = SamplingParams(max_tokens=6, temperature=0)
    try:
        before = client.submit_many([f"red green {i}" for i in range(10)], p)
        assert {r.status for r in wait_rows(direct, before).values()} == {"completed"}

        proxy.cut()  # the database is gone for the recorder
        during = client.submit_many([f"blue yellow {i}" for i in range(10)], p)
        deadline = time.monotonic() + 15
        while svc.recorder.metrics["db_retries"] < 2:
            assert time.monotonic() < deadline, "the recorder never hit the outage"
            time.sleep(0.1)
        assert not direct.get_requests(during)  # nothing could be written
        # the recorder is restarted while the database is still down: it held its offsets
        svc.recorder.stop()
        svc.threads[1].join(30)
        time.sleep(1.0)
        proxy.restore()
        recorder2 = Recorder(settings, Store(proxied)).open()
        t = threading.Thread(target=recorder2.run, daemon=True)
        t.start()
        try:
            rows = wait_rows(direct, before + during, timeout=60)
            assert len(rows) == 20 and {r.status for r in rows.values()} == {"completed"}
            assert all(rows[i].output for i in during)
        finally:
            recorder2.stop()
            t.join(30)
    finally:
        proxy.cut()
        svc.stop()
        client.close()
        direct.close()


def test_backlog_of_5000_drains_with_bounded_in_flight(broker, tiny_model, tmp_path):
    from inflight.producers.client import Client
    from inflight.store import Store

    url = f"sqlite:///{tmp_path / 'backlog.db'}"
    store = Store(url, create=True)
    limit = 32
    settings = make_settings(broker, url, worker_max_inflight=limit)
    client = Client(settings, store=store)
    n = 5000
    t0 = time.monotonic()
    ids = client.submit_many([{"prompt_token_ids": [5 + i % 200, 6, 7]} for i in range(n)],
                             SamplingParams(max_tokens=1, temperature=0), progress=False)
    submit_s = time.monotonic() - t0
    svc = Service(settings, tiny_engine(tiny_model, max_num_seqs=limit), store)
    w = svc.worker
    peak, paused_seen, peak_unacked = 0, False, 0
    try:
        deadline = time.monotonic() + 150
        while True:
            peak = max(peak, w.in_flight)
            peak_unacked = max(peak_unacked, len(w.publisher.tracked))
            paused_seen |= w.metrics["paused_partitions"] > 0
            if w.metrics["completed"] >= n:
                break
            assert time.monotonic() < deadline, w.metrics.summary()
            time.sleep(0.01)
        drain_s = time.monotonic() - t0 - submit_s
        counts = {}
        while time.monotonic() < deadline:
            counts = store.count_by_status()
            if counts["completed"] >= n:
                break
            time.sleep(0.2)
        assert counts["completed"] == n
        assert w.max_seen_inflight <= limit and peak <= limit
        assert paused_seen                      # it hit the limit and paused its partitions
        assert w.metrics["admitted"] == n
        print(f"\nbacklog {n}: submit {submit_s:.1f}s, worker drained in {drain_s:.1f}s, "
              f"peak in-flight {w.max_seen_inflight}/{limit}, peak unacked finals {peak_unacked}")
    finally:
        svc.stop()
        client.close()
        store.close()
    assert len(ids) == n
