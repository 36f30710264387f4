"""A partition paused with fetched records in hand is read again once resumed
(transport/kafka_parked.py), against the real broker with a bare kafka-python consumer:
records of A in hand, A paused, B's records thrown away by a seek, A resumed."""

from __future__ import annotations

import time

import pytest
from kafka import TopicPartition

pytestmark = [pytest.mark.broker]


def poll_until(consumer, want: TopicPartition, timeout: float = 5.0) -> list:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = consumer.poll(timeout_ms=100, max_records=1).get(want)
        if got:
            return got
    return []


def test_a_resumed_partition_is_read_again(kafka_settings):
    from inflight.transport.kafka_clients import plain_consumer, producer

    s = kafka_settings
    topic = s.topic_requests_batch
    p = producer(s)
    for part in (0, 1):
        for i in range(10):
            p.send(topic, key=b"k", value=b"%d" % i, partition=part)
    p.flush()
    p.close()
    a, b = TopicPartition(topic, 0), TopicPartition(topic, 1)
    c = plain_consumer(s, fetch_max_wait_ms=20)
    try:
        c.assign([a, b])
        c.seek(a, 0)
        c.seek(b, 0)
        deadline = time.monotonic() + 10
        while not (c._fetcher._next_partition_records and c._fetcher._completed_fetches):
            assert time.monotonic() < deadline, "both partitions were not fetched"
            c.poll(timeout_ms=50, max_records=1)   # one record at a time: records in hand
            c.seek(a, 0)
            c.seek(b, 0)
        first = c._fetcher._next_partition_records.topic_partition
        other = b if first == a else a
        c.pause(first)                              # its records are parked
        assert poll_until(c, other)                 # the other's records come in line...
        c.seek(other, 5)                            # ...and are thrown away by a seek
        c.poll(timeout_ms=50, max_records=1)
        c.resume(first)
        assert poll_until(c, first), "the resumed partition is never read again"
    finally:
        c.close()
