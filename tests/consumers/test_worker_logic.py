"""Worker decisions with a scripted fake engine on the real broker: the committed offset is
the watermark under out-of-order completion and across a rebalance, partitions pause at the
in-flight limit and resume, the batch topic yields to interactive traffic, SIGTERM hands
back unfinished work, and send failures (permanent or transient, of finals or of token
deltas) never stall the worker. The intake is driven by hand (`run_once`); the engine loop
and the publisher run in their threads."""

from __future__ import annotations

import threading
import time

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaTimeoutError

from inflight.consumers.thread_messages import PartitionsAssigned, PartitionsRevoked
from inflight.engine import RequestOutput
from inflight.schemas import PRIORITY_BATCH, SamplingParams, decode_result
from tests.consumers.conftest import make_settings, read_topic

pytestmark = [pytest.mark.broker]


class FakeEngine:
    """Holds every request until the test releases it. Requests are named by their prompt
    (the engine's request id is the worker's attempt id)."""

    def __init__(self, tokens: int = 1):
        self.tokens = tokens
        self.requests: dict[str, str] = {}     # prompt -> attempt
        self.released: set[str] = set()
        self.aborted: set[str] = set()
        self.added: list[str] = []
        self.lock = threading.Lock()

    def add_request(self, request_id, prompt=None, prompt_token_ids=None, params=None,
                    priority=0, **kw):
        with self.lock:
            self.requests[prompt] = request_id
            self.added.append(prompt)

    def abort(self, request_id):
        with self.lock:
            for prompt, attempt in self.requests.items():
                if attempt == request_id:
                    self.aborted.add(prompt)
                    return True
        return False

    def has_unfinished(self):
        return bool(self.requests)

    def step(self):
        outs = []
        with self.lock:
            for prompt in list(self.requests):
                if prompt in self.released or prompt in self.aborted:
                    attempt = self.requests.pop(prompt)
                    reason = "abort" if prompt in self.aborted else "length"
                    now = time.time()
                    ids = list(range(7, 7 + self.tokens))
                    outs.append(RequestOutput(attempt, ids, "x" * self.tokens, ids,
                                              "x" * self.tokens, True, reason,
                                              num_prompt_tokens=3, arrival_time=now,
                                              first_token_time=now, finish_time=now))
        if not outs:
            time.sleep(0.001)
        return outs


def _spin(worker, cond, timeout=15.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"condition not reached; {worker.metrics.summary()}"
        worker.run_once()
    return True


def _committed(settings, tp):
    c = KafkaConsumer(group_id=settings.worker_group, enable_auto_commit=False,
                      **settings.kafka_common())
    try:
        return c.committed(tp)
    finally:
        c.close()


def _open(settings, engine, **kw):
    from inflight.consumers.worker import Worker

    return Worker(settings, engine, **kw).open()


def _stop(worker):
    worker.stop()
    worker.shutdown()
    worker.close()


@pytest.fixture
def fake_worker(broker, tmp_path):
    from inflight.producers.client import Client

    settings = make_settings(broker, f"sqlite:///{tmp_path / 'x.db'}", partitions=1,
                             worker_drain_timeout_s=2.0)
    engine = FakeEngine()
    worker = _open(settings, engine, max_inflight=3)
    client = Client(settings)
    yield settings, engine, worker, client
    client.close()
    _stop(worker)


def _submit(client, *names, **kw):
    for name in names:
        client.submit(name, SamplingParams(max_tokens=1), request_id=name, flush=False, **kw)
    client.flush()


def test_commit_is_the_watermark_under_out_of_order_completion(fake_worker):
    settings, engine, worker, client = fake_worker
    _submit(client, "r0", "r1", "r2")
    tp = TopicPartition(settings.topic_requests, 0)
    tracker = worker.intake.tracker
    _spin(worker, lambda: len(engine.requests) == 3)
    engine.released |= {"r1", "r2"}             # r0 (offset 0) still running
    _spin(worker, lambda: tracker.parts[tp].num_pending == 1)
    worker.intake.commit()
    assert _committed(settings, tp) == 0        # nothing below r0 may be committed
    engine.released.add("r0")
    _spin(worker, lambda: tracker.parts[tp].num_pending == 0)
    worker.intake.commit()
    assert _committed(settings, tp) == 3


def test_pauses_at_the_limit_and_resumes(fake_worker):
    settings, engine, worker, client = fake_worker
    _submit(client, *(f"p{i}" for i in range(8)))
    _spin(worker, lambda: len(engine.requests) == 3)
    for _ in range(20):
        worker.run_once()
    assert worker.in_flight == 3 and len(engine.added) == 3      # bounded
    consumer = worker.intake.consumer
    assert consumer.paused() == consumer.assignment()
    assert worker.metrics["paused_partitions"] == len(consumer.assignment())
    engine.released |= {f"p{i}" for i in range(8)}
    _spin(worker, lambda: len(engine.added) == 8 and not engine.requests)
    assert worker.max_seen_inflight == 3
    _spin(worker, lambda: consumer.paused() == set())  # an idle interactive poll lets batch in


def test_batch_topic_waits_for_interactive_traffic(fake_worker):
    settings, engine, worker, client = fake_worker
    intake = worker.intake
    intake.max_inflight = 100
    _spin(worker, lambda: len(intake.consumer.assignment()) == 2)
    intake._interactive_busy = True
    intake._apply_pause(False)
    assert intake.consumer.paused() == {TopicPartition(settings.topic_requests_batch, 0)}
    intake._interactive_busy = False
    intake._apply_pause(False)
    assert intake.consumer.paused() == set()
    _submit(client, "b0", priority=PRIORITY_BATCH)  # batch requests run when interactive is idle
    _spin(worker, lambda: "b0" in engine.requests)


def test_sigterm_style_stop_hands_back_unfinished_work(fake_worker):
    settings, engine, worker, client = fake_worker
    _submit(client, "s0", "s1")
    _spin(worker, lambda: len(engine.requests) == 2)
    engine.released.add("s1")
    object.__setattr__(worker, "settings", settings.model_copy(update={"worker_drain_timeout_s": 0.5}))
    worker.stop()
    worker.shutdown()
    assert "s0" in engine.aborted and not worker.intake.jobs and not worker.in_flight
    # s0 (offset 0) was handed back: the committed offset stays below it
    assert _committed(settings, TopicPartition(settings.topic_requests, 0)) in (None, 0)
    finals = [decode_result(r.value) for r in read_topic(settings, settings.topic_results)]
    assert [e.request_id for e in finals if e.type == "final"] == ["s1"]  # none for s0


class HeldProducer:
    """The real producer, except that acknowledgements of final events are held back until
    released (a broker that is slow to acknowledge)."""

    def __init__(self, real, results_topic):
        from kafka.future import Future

        self.real, self.topic, self.Future = real, results_topic, Future
        self.held: list = []

    def send(self, topic, key=None, value=None, headers=None, partition=None):
        if topic == self.topic and b'"type":"final"' in value:
            fut = self.Future()
            self.held.append((fut, (topic, key, value, headers, partition)))
            return fut
        return self.real.send(topic, key=key, value=value, headers=headers, partition=partition)

    def release(self):
        for fut, (topic, key, value, headers, partition) in self.held:
            md = self.real.send(topic, key=key, value=value, headers=headers,
                                partition=partition).get(timeout=10)
            fut.success(md)
        self.held = []

    def __getattr__(self, name):
        return getattr(self.real, name)


def test_rebalance_never_commits_past_an_unacknowledged_final(fake_worker):
    """A revoke + reassign (as kafka-python's eager protocol does it: every partition
    revoked, positions reset to the committed offset) redelivers a request whose final was
    sent but not acknowledged: the redelivered copy waits for that final's ack instead of
    being settled at once (the old worker committed past it)."""
    settings, engine, worker, client = fake_worker
    intake = worker.intake
    held = HeldProducer(worker.producer, settings.topic_results)
    worker.publisher.producer = held
    tp = TopicPartition(settings.topic_requests, 0)
    _submit(client, "h0", "h1")
    _spin(worker, lambda: len(engine.requests) == 2)
    engine.released |= {"h0", "h1"}
    _spin(worker, lambda: len(held.held) == 2)          # both finals sent, neither acked
    mine = intake.consumer.assignment()
    intake._rebalances.put(PartitionsRevoked(set(mine)))
    intake._rebalances.put(PartitionsAssigned(set(mine)))
    intake.consumer.seek(tp, 0)                          # redelivery from the committed offset
    _spin(worker, lambda: worker.metrics["duplicates"] == 2)
    for _ in range(5):
        worker.run_once()
    intake.commit()
    assert _committed(settings, tp) in (None, 0)         # nothing acked: nothing committed
    assert len(engine.added) == 2                        # and nothing ran twice
    held.release()
    _spin(worker, lambda: not intake.jobs)
    intake.commit()
    assert _committed(settings, tp) == 2


class FlakyProducer:
    """The real producer, raising `exc` from send() for matching messages `times` times."""

    def __init__(self, real, match, exc, times):
        self.real, self.match, self.exc, self.left = real, match, exc, times

    def send(self, topic, key=None, value=None, headers=None, partition=None):
        if self.left and self.match(topic, key, value):
            self.left -= 1
            raise self.exc
        return self.real.send(topic, key=key, value=value, headers=headers, partition=partition)

    def send_untracked(self, topic, key, value, partition, on_error, headers=None):
        if self.left and self.match(topic, key, value):
            self.left -= 1
            raise self.exc
        self.real.send_untracked(topic, key, value, partition, on_error, headers)

    def __getattr__(self, name):
        return getattr(self.real, name)


def test_send_timeouts_of_deltas_and_finals_never_stall_the_worker(broker, tmp_path):
    """KafkaTimeoutError from send(): a token delta is dropped and counted (the final
    carries the whole text); a final is sent again after a backoff, and its offset is
    committed only once it is acknowledged."""
    from inflight.producers.client import Client

    settings = make_settings(broker, f"sqlite:///{tmp_path / 'x.db'}", partitions=1,
                             stream_interval_ms=0)
    engine = FakeEngine(tokens=3)
    worker = _open(settings, engine)
    client = Client(settings)
    try:
        flaky = FlakyProducer(worker.producer, lambda topic, key, value: key == b"t0" and (
            topic == settings.topic_results_tokens or b'"final"' in value),
            KafkaTimeoutError("metadata not available"), 3)
        worker.publisher.producer = flaky
        _submit(client, "t0", "t1")
        _spin(worker, lambda: len(engine.requests) == 2)
        engine.released |= {"t0", "t1"}
        tp = TopicPartition(settings.topic_requests, 0)
        _spin(worker, lambda: not worker.intake.jobs)
        assert flaky.left == 0 and worker.metrics["send_errors"] >= 1
        assert worker.metrics["send_retries"] >= 1 and worker.metrics["completed"] == 2
        worker.intake.commit()
        assert _committed(settings, tp) == 2
        finals = [decode_result(r.value) for r in read_topic(settings, settings.topic_results)]
        assert sorted(e.request_id for e in finals if e.type == "final") == ["t0", "t1"]
    finally:
        client.close()
        _stop(worker)


def test_a_final_too_large_for_kafka_becomes_a_small_error_final(broker, tmp_path):
    """Over our own limit (known before sending) and refused by the producer (its
    max_request_size; a broker limit answers the same way, later): either way the request
    ends with a `message_too_large` error final, and the next request still completes."""
    from inflight.transport.results_producer import results_producer
    from inflight.producers.client import Client

    settings = make_settings(broker, f"sqlite:///{tmp_path / 'x.db'}", partitions=1,
                             kafka_max_message_bytes=60_000)
    engine = FakeEngine(tokens=12_000)                 # a ~80 KB final event
    worker = _open(settings, engine)
    client = Client(settings)
    try:
        _submit(client, "big0")
        _spin(worker, lambda: len(engine.requests) == 1)
        engine.released.add("big0")
        _spin(worker, lambda: not worker.intake.jobs)
        worker.publisher.producer = results_producer(settings, **{"message.max.bytes": 20_000})
        engine.tokens = 5000                  # ~30 KB: under our limit, over the producer's
        _submit(client, "big1", "small")
        _spin(worker, lambda: len(engine.requests) == 2)
        engine.released.add("big1")
        _spin(worker, lambda: worker.metrics["send_errors"] >= 1)
        engine.tokens = 2
        engine.released.add("small")
        _spin(worker, lambda: not worker.intake.jobs)
        events = {e.request_id: e for e in (decode_result(r.value) for r in
                                            read_topic(settings, settings.topic_results))
                  if e.type in ("final", "error")}
        for rid in ("big0", "big1"):
            assert events[rid].type == "error" and events[rid].code == "message_too_large"
            assert "max_tokens" in events[rid].message
        assert events["small"].type == "final" and events["small"].token_ids == [7, 8]
        worker.intake.commit()
        assert _committed(settings, TopicPartition(settings.topic_requests, 0)) == 3
        worker.publisher.producer.close()
    finally:
        client.close()
        _stop(worker)


def test_work_of_a_partition_that_moved_away_is_handed_back(fake_worker):
    """After a rebalance that gives the partition to another worker, a running request is
    aborted and publishes nothing (the new owner redoes it from the uncommitted offset);
    one whose partition comes back keeps running and settles when its redelivery does."""
    settings, engine, worker, client = fake_worker
    intake = worker.intake
    tp = TopicPartition(settings.topic_requests, 0)
    _submit(client, "m0", "m1")
    _spin(worker, lambda: len(engine.requests) == 2)
    mine = set(intake.consumer.assignment())
    intake._rebalances.put(PartitionsRevoked(mine))         # everything revoked; the requests
    intake._rebalances.put(PartitionsAssigned(mine - {tp}))  # topic's partition goes to another worker
    _spin(worker, lambda: engine.aborted == {"m0", "m1"} and not intake.jobs)
    assert worker.metrics["handed_back"] == 2 and worker.metrics["cancelled"] == 0
    engine.aborted.clear()
    intake._rebalances.put(PartitionsAssigned({tp}))        # ... and comes back later
    intake.consumer.seek(tp, 0)
    _spin(worker, lambda: engine.added.count("m0") == 2)  # redone, as a new attempt
    engine.released |= {"m0", "m1"}
    _spin(worker, lambda: not intake.jobs)
    intake.commit()
    assert _committed(settings, tp) == 2
    finals = [decode_result(r.value) for r in read_topic(settings, settings.topic_results)]
    finals = [e for e in finals if e.type == "final"]
    assert sorted(e.request_id for e in finals) == ["m0", "m1"]   # one final each, the redo's
    assert all(e.finish_reason == "length" for e in finals)
