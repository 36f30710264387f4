"""Tracked sends: the messages that end a ticket (its final event, maybe a DLQ copy),
kept until Kafka acknowledges every one; then the ticket is reported settled (ACKED) to the
intake, which may commit its offsets.

Send failures never stall anything (each is a message of its own, retried on a timer):
- transient (timeouts, leader changes, the broker away): sent again with backoff; the
  ticket stays unsettled, so its offset is not committed meanwhile;
- permanent (too large for the producer or the broker, refused records): a final becomes
  a small ErrorEvent saying why (code message_too_large), a DLQ copy loses its body; if
  even that is refused, it is logged and the ticket is settled anyway (nothing to wait for).
A final over INFLIGHT_KAFKA_MAX_MESSAGE_BYTES is replaced before it is ever sent.

Runs on the publisher's thread; only the producer's callbacks enqueue (kafka-python's run on
its I/O thread; confluent-kafka's inside drain_acks, via the producer's poll_acks).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import queue
import time
from dataclasses import dataclass
from typing import Any, Literal

from kafka.errors import (InvalidRecordError, MessageSizeTooLargeError, RecordListTooLargeError,
                          TopicAuthorizationFailedError, UnknownTopicOrPartitionError,
                          UnsupportedForMessageFormatError)

from inflight.consumers import event_bytes
from inflight.consumers.dlq import dlq_value
from inflight.consumers.metrics import Metrics
from inflight.consumers.thread_messages import Settled, TicketState
from inflight.schemas import ERR_INTERNAL, ERR_MESSAGE_TOO_LARGE
from inflight.transport.results_producer import ResultsProducer

log = logging.getLogger("inflight.worker")

RETRY_START_S, RETRY_MAX_S = 0.1, 5.0
TOO_LARGE = (MessageSizeTooLargeError, RecordListTooLargeError)
REFUSED = TOO_LARGE + (InvalidRecordError, UnsupportedForMessageFormatError, TypeError,
                       ValueError, UnicodeError)

# a reply_to copy whose topic went away (deleted, or access revoked, after intake checked
# it): given up, so it never holds the request's offset back
GONE = (UnknownTopicOrPartitionError, TopicAuthorizationFailedError)

# What a tracked message is: a final event, its reply_to copy, a DLQ copy, or a last resort
# (no fallback left)
Kind = Literal["final", "reply", "dlq", "last"]
FINAL: Kind = "final"
REPLY: Kind = "reply"
DLQ: Kind = "dlq"
LAST: Kind = "last"


@dataclass(slots=True)
class Message:
    topic: str
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]] | None
    kind: Kind
    partition: int | None = None
    tries: int = 0
    done: bool = False


@dataclass(slots=True)
class Ending:
    """The tracked messages of one ticket (its final event, maybe a DLQ copy)."""

    ticket: int
    request_id: str | None
    attempt: str | None
    batch_id: str | None
    messages: list[Message]
    span: Any = None               # tracing on: the request's open spans, ended at the ack

    @property
    def remaining(self) -> int:
        return sum(not m.done for m in self.messages)


class TrackedSends:
    """The endings sent and not yet acknowledged, by ticket (see the module doc)."""

    producer: ResultsProducer   # the publisher's, set before its first send

    def __init__(self, settled: queue.SimpleQueue[Settled], *, worker: str, metrics: Metrics,
                 max_bytes: int):
        self.settled = settled
        self.worker = worker
        self.metrics = metrics
        self.max_bytes = max_bytes
        self.pending: dict[int, Ending] = {}        # by ticket, until acknowledged
        # (ticket, message index, None when acknowledged else the send's exception)
        self._acks: queue.SimpleQueue[tuple[int, int, BaseException | None]] = queue.SimpleQueue()
        self._retries: list[tuple[float, int, int, int]] = []
        self._seq = itertools.count()
        self._last_warning = 0.0

    def __len__(self) -> int:
        return len(self.pending)

    @property
    def next_retry(self) -> float | None:
        return self._retries[0][0] if self._retries else None

    def track(self, ending: Ending) -> None:
        for msg in ending.messages:
            if msg.kind in (FINAL, REPLY) and len(msg.value) > self.max_bytes:  # no need to ask Kafka
                self._replace_final(ending, msg, _too_large_text(len(msg.value), self.max_bytes))
        self.pending[ending.ticket] = ending
        for i in range(len(ending.messages)):
            self._send(ending.ticket, i)

    def _on_error(self, ticket: int, i: int, exc: BaseException) -> None:
        """Errback (the producer's I/O thread, or inside poll_acks): only enqueues."""
        self._acks.put((ticket, i, exc))

    def _send(self, ticket: int, i: int) -> None:
        msg = self.pending[ticket].messages[i]
        msg.tries += 1
        try:
            fut = self.producer.send(msg.topic, key=msg.key, value=msg.value, headers=msg.headers,
                                     partition=msg.partition)
        except Exception as exc:  # noqa: BLE001 - sorted into permanent / transient below
            self._failed(ticket, i, exc)
            return
        # NOTE: callbacks run on the producer's I/O thread; they only enqueue.
        fut.add_callback(self._on_ack, ticket, i)
        fut.add_errback(self._on_error, ticket, i)

    def _on_ack(self, ticket: int, i: int, _metadata: Any) -> None:
        self._acks.put((ticket, i, None))

    def drain_acks(self, wait: float = 0.0) -> None:
        """Apply the acknowledgements and failures that came in (waiting up to `wait`
        seconds for one); the producer's poll_acks runs first (failed untracked sends too)."""
        acks = self._acks
        # NOTE: confluent-kafka runs delivery callbacks inside poll_acks, on this thread, so
        # that is where to wait; kafka-python runs them on its I/O thread, into self._acks
        if self.producer.acks_in_poll:
            self.producer.poll_acks(wait)
            wait = 0.0
        else:
            self.producer.poll_acks(0.0)
        try:
            item = acks.get(timeout=wait) if wait else acks.get_nowait()
        except queue.Empty:
            return
        while True:
            ticket, i, exc = item
            ending = self.pending.get(ticket)
            if ending is not None and not ending.messages[i].done:
                if exc is None:
                    self._done(ending, i)
                else:
                    self._failed(ticket, i, exc)
            try:
                item = acks.get_nowait()
            except queue.Empty:
                return

    def _done(self, ending: Ending, i: int) -> None:
        ending.messages[i].done = True
        if ending.remaining == 0:
            del self.pending[ending.ticket]
            self.settled.put(Settled(ending.ticket, TicketState.ACKED))
            if ending.span is not None:
                ending.span.end()

    def _failed(self, ticket: int, i: int, exc: BaseException) -> None:
        ending = self.pending[ticket]
        msg = ending.messages[i]
        if msg.kind == REPLY and isinstance(exc, GONE):
            self.metrics.inc("send_errors")
            log.error("reply_to copy of %s's final to %s given up: %s", ending.request_id,
                      msg.topic, exc)
            self._done(ending, i)
            return
        if isinstance(exc, REFUSED):
            self.metrics.inc("send_errors")
            if msg.kind in (FINAL, REPLY):
                text = (_too_large_text(len(msg.value), None) if isinstance(exc, TOO_LARGE)
                        else f"the final event was refused by Kafka ({type(exc).__name__}: {exc})")
                log.error("final event of %s refused (%s); sending a small error final instead",
                          ending.request_id, exc)
                self._replace_final(ending, msg, text, code=(
                    ERR_MESSAGE_TOO_LARGE if isinstance(exc, TOO_LARGE) else ERR_INTERNAL))
            elif msg.kind == DLQ:
                log.error("DLQ copy for %s refused (%s); sending it without its body",
                          ending.request_id or "<no id>", exc)
                msg.value, msg.headers = dlq_value(msg.value, msg.headers or [], 0, bare=True)
                msg.kind = LAST
            else:
                log.error("message for %s refused twice (%s); giving up on it",
                          ending.request_id or "<no id>", exc)
                self._done(ending, i)
                return
            self._send(ticket, i)
            return
        # transient: send it again later; the ticket (and its offset) waits meanwhile
        self.metrics.inc("send_retries")
        delay = min(RETRY_START_S * 2 ** (msg.tries - 1), RETRY_MAX_S)
        self.warn("publishing for %s failed (%s); retrying in %.1fs", ending.request_id, exc,
                   delay)
        heapq.heappush(self._retries, (time.monotonic() + delay, next(self._seq), ticket, i))

    def _replace_final(self, ending: Ending, msg: Message, text: str,
                       code: str = ERR_MESSAGE_TOO_LARGE) -> None:
        msg.value = event_bytes.error_event(ending.request_id, ending.attempt, code, text,
                                            field=None, worker=self.worker,
                                            batch_id=ending.batch_id)
        msg.kind = LAST

    def retry_due(self) -> None:
        now = time.monotonic()
        while self._retries and self._retries[0][0] <= now:
            _, _, ticket, i = heapq.heappop(self._retries)
            if ticket in self.pending and not self.pending[ticket].messages[i].done:
                self._send(ticket, i)

    def warn(self, fmt: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self._last_warning >= 1.0:  # at most one a second: failures come in floods
            self._last_warning = now
            log.warning(fmt, *args)



def _too_large_text(size: int, limit: int | None) -> str:
    over = f"over the limit of {limit} bytes" if limit else "more than Kafka accepts"
    return (f"the result is too large to publish: its final event is {size} bytes, {over} "
            "(INFLIGHT_KAFKA_MAX_MESSAGE_BYTES, and the broker's message.max.bytes); lower "
            "max_tokens or raise both limits")
