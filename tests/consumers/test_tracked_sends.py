"""Tracked sends of a final and its reply_to copy (consumers/tracked_sends.py), with a stub
producer that answers each send at once."""

from __future__ import annotations

import queue

from kafka.errors import KafkaTimeoutError, UnknownTopicOrPartitionError

from inflight.consumers.metrics import Metrics
from inflight.consumers.thread_messages import TicketState
from inflight.consumers.tracked_sends import FINAL, REPLY, Ending, Message, TrackedSends


class _Answer:
    def __init__(self, error):
        self.error = error

    def add_callback(self, fn, *args):
        if self.error is None:
            fn(*args, None)

    def add_errback(self, fn, *args):
        if self.error is not None:
            fn(*args, self.error)


class StubProducer:
    """Acknowledges every send, but fails those to `failing` with its error."""

    acks_in_poll = False

    def __init__(self, failing: dict):
        self.failing = failing
        self.sent = []

    def send(self, topic, key=None, value=None, headers=None, partition=None):
        self.sent.append(topic)
        return _Answer(self.failing.get(topic))

    def poll_acks(self, timeout=0.0):
        return 0


def _track(failing: dict) -> tuple[TrackedSends, queue.SimpleQueue, StubProducer]:
    settled: queue.SimpleQueue = queue.SimpleQueue()
    sends = TrackedSends(settled, worker="w", metrics=Metrics("worker", 0.0), max_bytes=10_000)
    sends.producer = StubProducer(failing)
    sends.track(Ending(1, "r1", "a.1", None, [
        Message("results", b"r1", b'{"type":"final"}', [], FINAL),
        Message("replies", b"r1", b'{"type":"final"}', [], REPLY)]))
    sends.drain_acks()
    return sends, settled, sends.producer


def test_a_reply_topic_that_went_away_never_holds_the_offset_back():
    sends, settled, producer = _track({"replies": UnknownTopicOrPartitionError("gone")})
    assert settled.get_nowait().state is TicketState.ACKED and not sends.pending
    assert producer.sent == ["results", "replies"]  # given up at once, not retried


def test_a_transient_failure_of_the_reply_copy_holds_the_ticket_until_it_is_sent():
    sends, settled, producer = _track({"replies": KafkaTimeoutError("slow")})
    assert settled.empty() and sends.pending  # the offset waits for both copies
    producer.failing.clear()
    sends._retries = [(0.0, *entry[1:]) for entry in sends._retries]  # due now
    sends.retry_due()
    sends.drain_acks()
    assert settled.get_nowait().state is TicketState.ACKED
    assert producer.sent == ["results", "replies", "replies"]
