"""The worker's producer: confluent-kafka (librdkafka, in C) behind the few calls of
kafka-python's KafkaProducer that the publisher makes (transport.results_producer's
ResultsProducer), so consumers.tracked_sends and the tests' wrapping producers work with
either.

    send(topic, key, value, headers, partition) ─► Delivery (add_callback / add_errback / get)
    send_untracked(topic, key, value, partition, on_error)   token deltas, status events:
                        on_error(exc) only if it fails; nothing runs in Python on success
    poll_acks(timeout)  the delivery callbacks run here, on the caller's thread (the publisher's)
    partitions_for, flush, close

NOTE (why): kafka-python's producer spends Python CPU on every message between send()
and the acknowledgement, mostly in its I/O thread fighting the publisher for the GIL: it
was most of the worker's CPU at high token rates (docs/benchmarks.md, delivery path).
librdkafka encodes, batches and sends in C threads that never take the GIL.

NOTE (untracked sends): confluent-kafka takes the GIL back for every delivery report it
hands to Python, and gives it up after, so each report is a GIL hand-over to whichever
thread waits (the engine's, the intake's): with one report per token delta that cost more
than the sends themselves. Untracked messages go through a second librdkafka producer that
reports failures only (`delivery.report.only.error`). Status events go there too, so one
may reach inflight.results after its request's final event: harmless, the store's upsert
never moves a row back and streams read deltas and finals only.

Errors arrive as kafka-python's exception classes (consumers.tracked_sends sorts them into
permanent and transient): a message over `message.max.bytes` is refused in produce()
(MessageSizeTooLargeError), as kafka-python's max_request_size check does; the broker's
refusals come back through the delivery callback.

INFLIGHT_KAFKA_WORKER_PRODUCER=kafka-python selects kafka-python's producer instead (same
settings; transport/results_producer.py); INFLIGHT_KAFKA_RDKAFKA_OPTIONS passes any other
librdkafka setting.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError as RdError
from confluent_kafka import KafkaException, Producer
from kafka.errors import (InvalidRecordError, KafkaError, KafkaTimeoutError,
                          MessageSizeTooLargeError, RecordListTooLargeError,
                          UnsupportedForMessageFormatError, TopicAuthorizationFailedError,
                          UnknownTopicOrPartitionError)

from inflight.schemas.settings import Settings
from inflight.transport.kafka_clients import producer_config

QUEUE_FULL_WAIT_S = 0.05   # produce() on a full local queue: serve callbacks, try again
MAX_BLOCK_S = 60.0         # ... for at most this long (kafka-python's max_block_ms)


class Delivery:
    """The outcome of one send, with kafka-python's Future interface (the callbacks get
    the arguments given, then the value or the exception)."""

    __slots__ = ("_producer", "_callbacks", "_errbacks", "value", "exception", "is_done")

    def __init__(self, producer: "RdProducer"):
        self._producer = producer
        self._callbacks: list | None = None
        self._errbacks: list | None = None
        self.value: Any = None
        self.exception: BaseException | None = None
        self.is_done = False

    def add_callback(self, fn: Any, *args: Any) -> "Delivery":
        if self.is_done:
            if self.exception is None:
                fn(*args, self.value)
        elif self._callbacks is None:
            self._callbacks = [(fn, args)]
        else:
            self._callbacks.append((fn, args))
        return self

    def add_errback(self, fn: Any, *args: Any) -> "Delivery":
        if self.is_done:
            if self.exception is not None:
                fn(*args, self.exception)
        elif self._errbacks is None:
            self._errbacks = [(fn, args)]
        else:
            self._errbacks.append((fn, args))
        return self

    def succeeded(self) -> bool:
        return self.is_done and self.exception is None

    def failed(self) -> bool:
        return self.is_done and self.exception is not None

    def _delivered(self, err: Any, msg: Any) -> None:
        """librdkafka's delivery report (inside poll_acks / flush, on the polling thread)."""
        self.is_done = True
        if err is None:
            self.value = msg
            for fn, args in self._callbacks or ():
                fn(*args, msg)
        else:
            self.exception = exc = kafka_error(err)
            for fn, args in self._errbacks or ():
                fn(*args, exc)
        self._callbacks = self._errbacks = None

    def get(self, timeout: float | None = None) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.is_done:
            if deadline is not None and time.monotonic() > deadline:
                raise KafkaTimeoutError(f"no delivery report within {timeout}s")
            self._producer.poll_acks(0.05)
        if self.exception is not None:
            raise self.exception
        return self.value


class RdProducer:
    """confluent_kafka.Producer with kafka-python's send() (see the module doc); a
    transport.results_producer.ResultsProducer."""

    acks_in_poll = True   # delivery callbacks run inside poll_acks, on the caller's thread

    def __init__(self, settings: Settings, **overrides: Any):
        config: dict[str, Any] = {
            **settings.rdkafka_common(),
            **producer_config(settings),
            # NOTE: Java's partitioner (and kafka-python's) for keys, should a send come
            # without a partition; the publisher picks them itself (transport.partitioner)
            "partitioner": "murmur2_random",
            "logger": logging.getLogger("inflight.rdkafka"),  # not stderr (served in poll)
        }
        config.update(settings.kafka_rdkafka_options)
        config.update(overrides)
        self._p = Producer(config)
        self._fire = Producer({**config, "delivery.report.only.error": True})
        self._on_error: dict[Callable, Callable] = {}  # on_error -> its delivery callback

    def send(self, topic: str, key: bytes | None = None, value: bytes | None = None,
             headers: list[tuple[str, bytes]] | None = None,
             partition: int | None = None) -> Delivery:
        fut = Delivery(self)
        self._produce(self._p, topic, key, value, partition, fut._delivered, headers)
        return fut

    def send_untracked(self, topic: str, key: bytes | None, value: bytes,
                       partition: int | None, on_error: Callable[[BaseException], None],
                       headers: list[tuple[str, bytes]] | None = None) -> None:
        """Send without tracking: `on_error(exc)` runs (in poll_acks) only if it fails."""
        report = self._on_error.get(on_error)
        if report is None:
            def report(err: Any, _msg: Any) -> None:
                on_error(kafka_error(err))
            self._on_error[on_error] = report
        self._produce(self._fire, topic, key, value, partition, report, headers)

    def _produce(self, p: Any, topic: str, key: bytes | None, value: bytes | None,
                 partition: int | None, report: Any, headers: Any) -> None:
        deadline = None
        while True:
            try:
                p.produce(topic, value, key, -1 if partition is None else partition, report,
                          headers=headers)
                return
            except BufferError:
                # the local queue is full (the broker is slow or away): kafka-python blocks
                # up to max_block_ms, then raises KafkaTimeoutError; so does this
                now = time.monotonic()
                deadline = deadline or now + MAX_BLOCK_S
                if now > deadline:
                    raise KafkaTimeoutError("the producer's queue stayed full for "
                                            f"{MAX_BLOCK_S:.0f}s") from None
                p.poll(QUEUE_FULL_WAIT_S)
            except KafkaException as exc:
                raise kafka_error(exc.args[0]) from None

    def poll_acks(self, timeout: float = 0.0) -> int:
        """Run the delivery callbacks of what Kafka answered since the last call (waiting up
        to `timeout` seconds for one)."""
        return self._fire.poll(0) + self._p.poll(timeout)

    def partitions_for(self, topic: str) -> set[int] | None:
        md = self._p.list_topics(topic, timeout=10)
        t = md.topics.get(topic)
        if t is None or t.error is not None or not t.partitions:
            return None
        return set(t.partitions)

    def flush(self, timeout: float | None = None) -> None:
        left = self._fire.flush(-1 if timeout is None else timeout)
        left += self._p.flush(-1 if timeout is None else timeout)
        if left:
            raise KafkaTimeoutError(f"{left} message(s) not delivered within {timeout}s")

    def close(self, timeout: float | None = None) -> None:
        """Deliver what is queued (up to `timeout` seconds); what is not is dropped."""
        self._fire.flush(30 if timeout is None else timeout)
        self._p.flush(30 if timeout is None else timeout)


def kafka_error(err: Any) -> KafkaError:
    """A librdkafka KafkaError as the kafka-python exception consumers.tracked_sends sorts on."""
    code = err.code()
    text = f"{err.name()}: {err.str()}"
    if code == RdError.MSG_SIZE_TOO_LARGE:
        return MessageSizeTooLargeError(text)
    if code == RdError.RECORD_LIST_TOO_LARGE:
        return RecordListTooLargeError(text)
    if code in (RdError.INVALID_RECORD, RdError.INVALID_MSG_SIZE):
        return InvalidRecordError(text)
    if code in (RdError._UNKNOWN_TOPIC, RdError.UNKNOWN_TOPIC_OR_PART):
        return UnknownTopicOrPartitionError(text)
    if code == RdError.TOPIC_AUTHORIZATION_FAILED:
        return TopicAuthorizationFailedError(text)
    if code == RdError.UNSUPPORTED_FOR_MESSAGE_FORMAT:
        return UnsupportedForMessageFormatError(text)
    if code in (RdError._MSG_TIMED_OUT, RdError._TIMED_OUT, RdError._TIMED_OUT_QUEUE,
                RdError.REQUEST_TIMED_OUT):
        return KafkaTimeoutError(text)
    return KafkaError(text)  # transient to consumers.tracked_sends: sent again with backoff
