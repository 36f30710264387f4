"""The worker's results producer: what the publisher and its tracked sends ask of it, and
the two that do it (INFLIGHT_KAFKA_WORKER_PRODUCER).

    send(topic, key, value, headers, partition) -> SendFuture   tracked: final events, DLQ
                        copies (callbacks and errbacks only enqueue: they may run on any thread)
    send_untracked(topic, key, value, partition, on_error, headers)  token deltas, status events:
                        on_error(exc) runs inside poll_acks, on the caller's thread, and only
                        if the send failed
    poll_acks(timeout)  run what is due (librdkafka's delivery reports; failed untracked sends)
    partitions_for, flush, close

- librdkafka (default): transport/librdkafka_producer.py.
- kafka-python: KafkaPythonResults below, kafka-python's KafkaProducer with the two calls it
  lacks; its tracked callbacks run on its I/O thread, as kafka-python runs them.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from typing import Any, Protocol

from kafka import KafkaProducer

from inflight.schemas.settings import Settings
from inflight.transport.kafka_clients import producer as kafka_python_producer
from inflight.transport.librdkafka_producer import RdProducer

OnError = Callable[[BaseException], None]


class SendFuture(Protocol):
    """kafka-python's FutureRecordMetadata, as far as a sender uses it: each callback gets
    the arguments given, then the record's metadata (callback) or the exception (errback)."""

    def add_callback(self, fn: Callable[..., Any], *args: Any) -> Any: ...
    def add_errback(self, fn: Callable[..., Any], *args: Any) -> Any: ...


class ResultsProducer(Protocol):
    # True: tracked callbacks run inside poll_acks (librdkafka), which a waiting reader of
    # acknowledgements must call with its timeout; False: on the producer's own I/O thread
    acks_in_poll: bool

    def send(self, topic: str, key: bytes | None = None, value: bytes | None = None,
             headers: list[tuple[str, bytes]] | None = None,
             partition: int | None = None) -> SendFuture: ...
    def send_untracked(self, topic: str, key: bytes | None, value: bytes,
                       partition: int | None, on_error: OnError,
                       headers: list[tuple[str, bytes]] | None = None) -> None: ...
    def poll_acks(self, timeout: float = 0.0) -> int: ...
    def partitions_for(self, topic: str) -> set[int] | None: ...
    def flush(self, timeout: float | None = None) -> None: ...
    def close(self, timeout: float | None = None) -> None: ...


def results_producer(settings: Settings, **overrides: Any) -> ResultsProducer:
    """The worker's producer, as INFLIGHT_KAFKA_WORKER_PRODUCER says. `overrides`: librdkafka
    settings (confluent) or kafka-python keyword arguments (kafka-python)."""
    if settings.kafka_worker_producer == "kafka-python":
        return KafkaPythonResults(kafka_python_producer(settings, **overrides))
    return RdProducer(settings, **overrides)


class KafkaPythonResults:
    """kafka-python's producer as a ResultsProducer: an untracked send is a plain send whose
    failure is queued (kafka-python reports it on its I/O thread) and handed to `on_error`
    in poll_acks, on the caller's thread, as librdkafka's reports are."""

    acks_in_poll = False  # kafka-python runs tracked callbacks on its I/O thread

    def __init__(self, producer: KafkaProducer):
        self.producer = producer
        self._failed: queue.SimpleQueue[tuple[OnError, BaseException]] = queue.SimpleQueue()

    def send(self, topic: str, key: bytes | None = None, value: bytes | None = None,
             headers: list[tuple[str, bytes]] | None = None,
             partition: int | None = None) -> SendFuture:
        return self.producer.send(topic, key=key, value=value, headers=headers,
                                  partition=partition)

    def send_untracked(self, topic: str, key: bytes | None, value: bytes,
                       partition: int | None, on_error: OnError,
                       headers: list[tuple[str, bytes]] | None = None) -> None:
        fut = self.producer.send(topic, key=key, value=value, partition=partition,
                                 headers=headers)
        fut.add_errback(lambda exc: self._failed.put((on_error, exc)))

    def poll_acks(self, timeout: float = 0.0) -> int:
        """Failed untracked sends' on_error; kafka-python runs tracked callbacks itself."""
        n = 0
        while True:
            try:
                on_error, exc = self._failed.get_nowait()
            except queue.Empty:
                return n
            on_error(exc)
            n += 1

    def partitions_for(self, topic: str) -> set[int] | None:
        return self.producer.partitions_for(topic)

    def flush(self, timeout: float | None = None) -> None:
        self.producer.flush(timeout=timeout)

    def close(self, timeout: float | None = None) -> None:
        self.producer.close(timeout=timeout)
