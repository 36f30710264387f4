"""Read what a topic holds, from the beginning, for assertions in tests."""

from __future__ import annotations

import time

from kafka import TopicPartition


def read_topic(settings, topic: str, n: int, timeout: float = 10.0) -> list:
    """Up to `n` records of `topic` (all partitions), waiting at most `timeout` seconds."""
    from inflight.transport.kafka_clients import partitions_of, plain_consumer

    c = plain_consumer(settings)
    try:
        tps = [TopicPartition(topic, p) for p in partitions_of(c, topic)]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        out, deadline = [], time.monotonic() + timeout
        while len(out) < n and time.monotonic() < deadline:
            for recs in c.poll(timeout_ms=200).values():
                out.extend(recs)
        return out
    finally:
        c.close()
