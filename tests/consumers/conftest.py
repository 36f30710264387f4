"""Fixtures for the service path: a tiny real model, isolated topic sets, and a running
worker + recorder (threads, real engine, real broker, real database)."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

from inflight.schemas import Settings
from tests.kafka_settings import make_settings as make_kafka_settings


def make_settings(broker, database_url: str, partitions: int = 2, **overrides) -> Settings:
    """tests.kafka_settings.make_settings with the metrics summary line every loop."""
    return make_kafka_settings(broker, database_url, partitions,
                               **{"metrics_interval_s": 0.0, **overrides})


def tiny_engine(model: Path, **kw):
    from inflight.engine import Engine, EngineConfig

    cfg = {"model": str(model), "num_kv_blocks": 512, "max_num_seqs": 64}
    cfg.update(kw)
    return Engine(EngineConfig(**cfg))


def slowed_engine(model: Path, step_s: float, **kw):
    """tiny_engine whose steps each sleep `step_s` first, so runs last long enough to
    overlap a group join or a fault."""
    engine = tiny_engine(model, **kw)
    step = engine.step
    engine.step = lambda: (time.sleep(step_s), step())[1]
    return engine


def finals_of(eng) -> dict:
    """Step `eng` until it has nothing left: each request's final output by id."""
    out = {}
    while eng.has_unfinished():
        for o in eng.step():
            if o.finished:
                out[o.request_id] = o
    return out


class Service:
    """A worker and a recorder running in threads."""

    def __init__(self, settings: Settings, engine, store=None, *, worker: bool = True,
                 recorder: bool = True):
        from inflight.consumers.recorder import Recorder
        from inflight.consumers.worker import Worker

        self.settings = settings
        self.worker = Worker(settings, engine) if worker else None
        self.recorder = Recorder(settings, store) if recorder else None
        self.threads = []
        for part in (self.worker, self.recorder):
            if part is not None:
                part.open()
                t = threading.Thread(target=part.run, daemon=True)
                t.start()
                self.threads.append(t)

    def stop(self) -> None:
        for part in (self.worker, self.recorder):
            if part is not None:
                part.stop()
        for t in self.threads:
            t.join(timeout=60)
            assert not t.is_alive(), "a service thread did not stop"


def migrated(url: str) -> str:
    from inflight.store import upgrade

    upgrade(url)
    return url


def create_topic(settings: Settings, name: str, partitions: int = 2) -> None:
    """One more topic on the test's broker (a reply_to topic)."""
    from kafka.admin import NewTopic

    from inflight.transport.topics_admin import admin_client

    admin = admin_client(settings)
    try:
        admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        admin.close()


def read_topic(settings: Settings, topic: str, *, until=None, timeout: float = 10.0) -> list:
    """Every record of `topic` from the beginning (stops when `until(records)` or timeout)."""
    from kafka import TopicPartition

    from inflight.transport.kafka_clients import partitions_of, plain_consumer

    consumer = plain_consumer(settings)
    try:
        tps = [TopicPartition(topic, p) for p in partitions_of(consumer, topic)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        out = []
        deadline = time.monotonic() + timeout
        idle = 0
        while time.monotonic() < deadline:
            got = consumer.poll(timeout_ms=200)
            for recs in got.values():
                out.extend(recs)
            if until is not None and until(out):
                break
            idle = idle + 1 if not got else 0
            if until is None and idle >= 3:
                break
        return out
    finally:
        consumer.close()


def results_by_request(settings: Settings, expect_finals: set[str], timeout: float = 20.0) -> dict:
    """{request_id: [decoded events of the results topic (status, final), in topic order]}
    once every id in `expect_finals` has a final event there."""
    from inflight.schemas import decode_result

    def done(recs) -> bool:
        finals = {r.key.decode() for r in recs
                  if r.key and b'"type":"status"' not in r.value}
        return expect_finals <= finals

    recs = read_topic(settings, settings.topic_results, until=done, timeout=timeout)
    events = defaultdict(list)
    for r in recs:
        ev = decode_result(r.value)
        events[ev.request_id].append(ev)
    return dict(events)


def tokens_by_request(settings: Settings, timeout: float = 5.0) -> dict:
    """{request_id: [TokenEvents of the tokens topic, in topic order]} (all of it)."""
    from inflight.schemas import decode_result

    events = defaultdict(list)
    for r in read_topic(settings, settings.topic_results_tokens, timeout=timeout):
        ev = decode_result(r.value)
        events[ev.request_id].append(ev)
    return dict(events)


def wait_rows(store, ids, timeout: float = 60.0, final: bool = True) -> dict:
    from inflight.store import FINAL_STATUSES

    ids = list(ids)
    deadline = time.monotonic() + timeout
    while True:
        rows = store.get_requests(ids)
        ok = {i: r for i, r in rows.items() if (r.status in FINAL_STATUSES or not final)}
        if len(ok) == len(ids) or time.monotonic() > deadline:
            return rows
        time.sleep(0.1)
