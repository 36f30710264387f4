"""Worker decisions with a scripted fake engine on the real broker: the committed offset is
the watermark under out-of-order completion, partitions pause at the in-flight limit and
resume, and the batch topic yields to interactive traffic. The loop is driven by hand
(`run_once`), so every assertion sees a known state."""

from __future__ import annotations

import time

import pytest
from kafka import KafkaConsumer, TopicPartition

from engine import RequestOutput
from schemas import PRIORITY_BATCH, SamplingParams
from tests.consumers.conftest import make_settings

pytestmark = [pytest.mark.broker]


class FakeEngine:
    """Holds every request until the test releases it."""

    def __init__(self):
        self.requests: dict[str, object] = {}
        self.released: set[str] = set()
        self.aborted: set[str] = set()
        self.added: list[str] = []

    def add_request(self, request_id, prompt=None, prompt_token_ids=None, params=None,
                    priority=0, **kw):
        self.requests[request_id] = params
        self.added.append(request_id)

    def abort(self, request_id):
        if request_id in self.requests:
            self.aborted.add(request_id)
            return True
        return False

    def has_unfinished(self):
        return bool(self.requests)

    def step(self):
        outs = []
        for rid in list(self.requests):
            if rid in self.released or rid in self.aborted:
                del self.requests[rid]
                reason = "abort" if rid in self.aborted else "length"
                now = time.time()
                outs.append(RequestOutput(rid, [7], "x", [7], "x", True, reason,
                                          num_prompt_tokens=3, arrival_time=now,
                                          first_token_time=now, finish_time=now))
        return outs


def _spin(worker, cond, timeout=15.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        worker.run_once()
    return True


def _committed(settings, tp):
    c = KafkaConsumer(group_id=settings.worker_group, enable_auto_commit=False,
                      **settings.kafka_common())
    try:
        return c.committed(tp)
    finally:
        c.close()


@pytest.fixture
def fake_worker(broker, tmp_path):
    from consumers.worker import Worker
    from producers.client import Client

    settings = make_settings(broker, f"sqlite:///{tmp_path / 'x.db'}", partitions=1)
    engine = FakeEngine()
    worker = Worker(settings, engine, max_inflight=3).open()
    client = Client(settings)
    yield settings, engine, worker, client
    client.close()
    worker.close()


def test_commit_is_the_watermark_under_out_of_order_completion(fake_worker):
    settings, engine, worker, client = fake_worker
    ids = [client.submit("hi", SamplingParams(max_tokens=1), request_id=f"r{i}") for i in range(3)]
    tp = TopicPartition(settings.topic_requests, 0)
    _spin(worker, lambda: len(engine.requests) == 3)
    engine.released |= {"r1", "r2"}             # r0 (offset 0) still running
    _spin(worker, lambda: worker.tracker.parts[tp].num_pending == 1)
    worker._commit()
    assert _committed(settings, tp) == 0        # nothing below r0 may be committed
    engine.released.add("r0")
    _spin(worker, lambda: worker.tracker.parts[tp].num_pending == 0)
    worker._commit()
    assert _committed(settings, tp) == 3
    assert ids == ["r0", "r1", "r2"]


def test_pauses_at_the_limit_and_resumes(fake_worker):
    settings, engine, worker, client = fake_worker
    for i in range(8):
        client.submit("hi", SamplingParams(max_tokens=1), request_id=f"p{i}")
    _spin(worker, lambda: len(engine.requests) == 3)
    for _ in range(20):
        worker.run_once()
    assert len(worker.inflight) == 3 and len(engine.added) == 3      # bounded
    assigned = worker.consumer.assignment()
    assert worker.consumer.paused() == assigned and worker.metrics["paused_partitions"] == len(assigned)
    engine.released |= {f"p{i}" for i in range(8)}
    _spin(worker, lambda: len(engine.added) == 8 and not engine.requests)
    assert worker.max_seen_inflight == 3
    for _ in range(5):  # an empty interactive poll lets the batch topic back in
        worker.run_once()
    assert worker.consumer.paused() == set()


def test_batch_topic_waits_for_interactive_traffic(fake_worker):
    settings, engine, worker, client = fake_worker
    worker.max_inflight = 100
    _spin(worker, lambda: len(worker.consumer.assignment()) == 2)
    worker._interactive_busy = True
    worker._apply_pause(room=10)
    assert worker.consumer.paused() == {TopicPartition(settings.topic_requests_batch, 0)}
    worker._interactive_busy = False
    worker._apply_pause(room=10)
    assert worker.consumer.paused() == set()
    # batch requests still run when interactive is idle
    rid = client.submit("hi", SamplingParams(max_tokens=1), priority=PRIORITY_BATCH)
    _spin(worker, lambda: rid in engine.requests)


def test_sigterm_style_stop_hands_back_unfinished_work(fake_worker):
    settings, engine, worker, client = fake_worker
    client.submit("hi", SamplingParams(max_tokens=1), request_id="s0")
    client.submit("hi", SamplingParams(max_tokens=1), request_id="s1")
    _spin(worker, lambda: len(engine.requests) == 2)
    engine.released.add("s1")
    object.__setattr__(worker, "settings", settings.model_copy(update={"worker_drain_timeout_s": 0.5}))
    worker.stop()
    worker._shutdown()
    assert "s0" in engine.aborted and not worker.inflight
    # s0 (offset 0) was handed back: the committed offset stays below it
    assert _committed(settings, TopicPartition(settings.topic_requests, 0)) in (None, 0)
