"""The publisher thread: engine outputs in, events out, acknowledgements back to the intake.

    Admitted ─► StatusEvent (inflight.results)
    step outputs ─► engine metrics (vLLM's histograms: TTFT, inter-token latency, e2e)
                 ─► per request: new tokens gathered into one delta ─► TokenEvent
                    (inflight.results.tokens), flushed every stream_interval_ms, at
                    stream_max_tokens, at once for the first delta (time to first token)
                    and before the final; only for requests that stream
                 ─► finished: FinalEvent, or an ErrorEvent (+ DLQ copy when the input was
                    at fault) on inflight.results, tracked until Kafka acknowledges it
    acks ─► the ticket's last message acknowledged ─► settled queue (the intake commits)

Events are encoded by consumers.event_bytes (orjson on plain values, no pydantic).

Send failures never stall the loop (each is a message of its own, retried on a timer):
- transient (timeouts, leader changes, the broker away): sent again with backoff; the
  ticket stays unsettled, so its offset is not committed meanwhile;
- permanent (too large for the producer or the broker, refused records): a final becomes
  a small ErrorEvent saying why (code message_too_large), a DLQ copy loses its body; if
  even that is refused, it is logged and the ticket is settled anyway (nothing to wait for);
- token deltas are not tracked: a lost delta is counted and logged; streams complete from
  the final event, which carries the whole text.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from kafka.errors import (InvalidRecordError, MessageSizeTooLargeError, RecordListTooLargeError,
                          UnsupportedForMessageFormatError)

from consumers import event_bytes
from consumers.dlq import dlq_headers, dlq_value
from consumers.handoff import (ABORTED, ACKED, ADD_FAILED, ADMIT, DROPPED, FINISHED, HAND_BACK,
                               OUTPUTS, REJECT, STOP, Aborted, Admitted, Rejected)
from consumers.engine_metrics import EngineMetrics
from consumers.metrics import Metrics
from schemas import ERR_ENGINE, ERR_INTERNAL, ERR_INVALID_REQUEST, ERR_MESSAGE_TOO_LARGE, Settings

log = logging.getLogger("inflight.worker")

QUEUE_SIZE = 1024          # engine steps (and intake commands) waiting to be published
BATCH = 256                # commands handled before acks, retries and flushes get a turn
ACK_POLL_S = 0.005         # how often acks are looked at while some are outstanding
IDLE_S = 0.1
RETRY_START_S, RETRY_MAX_S = 0.1, 5.0
TOO_LARGE = (MessageSizeTooLargeError, RecordListTooLargeError)
REFUSED = TOO_LARGE + (InvalidRecordError, UnsupportedForMessageFormatError, TypeError,
                       ValueError, UnicodeError)

FINAL, DLQ, LAST = "final", "dlq", "last"   # what a tracked message is (LAST: no fallback)


@dataclass(slots=True)
class _Stream:
    """Publishing state of one admitted attempt."""

    job: Admitted
    key: bytes
    index: int = 0                 # token events sent
    start: int = 0                 # tokens sent in them
    ids: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    dirty: bool = False
    handed_back: bool = False


@dataclass(slots=True)
class _Message:
    topic: str
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]] | None
    kind: str
    tries: int = 0
    done: bool = False


@dataclass(slots=True)
class _Ending:
    """The tracked messages of one ticket (its final event, maybe a DLQ copy)."""

    ticket: int
    request_id: str | None
    attempt: str | None
    batch_id: str | None
    messages: list[_Message]

    @property
    def remaining(self) -> int:
        return sum(not m.done for m in self.messages)


class Publisher:
    def __init__(self, settings: Settings, producer: Any, settled: queue.SimpleQueue, *,
                 worker: str, metrics: Metrics, engine_metrics: EngineMetrics | None = None,
                 logprobs: Any = None):
        """`logprobs`: engine_bridge.LogprobShaper of the engine's tokenizer (None: requests
        that asked for logprobs get none)."""
        self.settings = settings
        self.producer = producer
        self.settled = settled
        self.worker = worker
        self.metrics = metrics
        self.engine_metrics = engine_metrics
        self.shape_logprobs = logprobs
        self.queue: queue.Queue = queue.Queue(maxsize=QUEUE_SIZE)
        self.topic_results = settings.topic_results
        self.topic_tokens = settings.topic_results_tokens
        self.interval_s = settings.stream_interval_ms / 1000.0
        self.max_tokens = settings.stream_max_tokens
        self.max_bytes = settings.kafka_max_message_bytes
        self.streams: dict[str, _Stream] = {}        # by attempt
        self.endings: dict[int, _Ending] = {}        # by ticket, until acknowledged
        self._dirty: list[_Stream] = []
        self._next_flush = 0.0
        self._acks: queue.SimpleQueue = queue.SimpleQueue()
        self._retries: list[tuple[float, int, int, int]] = []
        self._seq = itertools.count()
        self._last_warning = 0.0
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> "Publisher":
        self.thread = threading.Thread(target=self.run, name="publisher", daemon=True)
        self.thread.start()
        return self

    def stop(self, ack_timeout: float = 10.0) -> None:
        """Flush, wait up to `ack_timeout` seconds for outstanding acknowledgements, exit."""
        self.queue.put((STOP, ack_timeout))

    def join(self, timeout: float | None = None) -> bool:
        if self.thread is not None:
            self.thread.join(timeout)
            return not self.thread.is_alive()
        return True

    def run(self) -> None:
        try:
            ack_timeout = self._loop()
            self._flush_all()
            deadline = time.monotonic() + ack_timeout
            while self.endings and time.monotonic() < deadline:
                self._drain_acks(wait=ACK_POLL_S)
                self._retry_due()
            if self.endings:
                log.warning("%d final event(s) unacknowledged at shutdown; their requests "
                            "are redone by the group", len(self.endings))
        except BaseException as exc:  # noqa: BLE001 - reported to the worker, which stops
            log.exception("the publisher failed; the worker stops")
            self.error = exc

    def _loop(self) -> float:
        q = self.queue
        while True:
            try:
                item = q.get(timeout=self._wait_s())
            except queue.Empty:
                item = None
            handled = 0
            while item is not None:
                if item[0] == STOP:
                    return item[1]
                self.handle(item)
                handled += 1
                if handled >= BATCH:
                    break
                try:
                    item = q.get_nowait()
                except queue.Empty:
                    item = None
            self.tick()

    def _wait_s(self) -> float | None:
        now = time.monotonic()
        wait = IDLE_S
        if self._dirty:
            wait = min(wait, max(self._next_flush - now, 0.0))
        if self.endings:
            wait = min(wait, ACK_POLL_S)
        if self._retries:
            wait = min(wait, max(self._retries[0][0] - now, 0.0))
        return wait

    def tick(self) -> None:
        """Acks, due retries and due flushes (after each batch of commands)."""
        self._drain_acks()
        self._retry_due()
        if self._dirty and time.monotonic() >= self._next_flush:
            self._flush_all()

    # -- commands ---------------------------------------------------------------------------
    def handle(self, item: tuple[str, Any]) -> None:
        kind, payload = item
        if kind == OUTPUTS:
            outputs, at = payload
            if self.engine_metrics is not None:
                self.engine_metrics.observe_outputs(outputs, at)
            self._outputs(outputs)
        elif kind == ADMIT:
            self._admit(payload)
        elif kind == REJECT:
            self._reject(payload)
        elif kind == ABORTED:
            self._aborted(payload)
        elif kind == HAND_BACK:
            st = self.streams.get(payload)
            if st is not None:
                st.handed_back, st.ids, st.texts = True, [], []
        elif kind == ADD_FAILED:
            attempt, message = payload
            st = self.streams.pop(attempt, None)
            if st is not None:
                self.settled.put((st.job.ticket, FINISHED))
                self._engine_error(st, ERR_INVALID_REQUEST, message)

    def _admit(self, job: Admitted) -> None:
        key = job.request_id.encode()
        self.streams[job.attempt] = _Stream(job, key)
        self._send_untracked(self.topic_results, key, event_bytes.status_event(
            job.request_id, job.attempt, self.worker, job.queued_at))

    def _outputs(self, outputs: list[Any]) -> None:
        streams, tokens = self.streams, 0
        for out in outputs:
            st = streams.get(out.request_id)
            if st is None:
                continue
            ids = out.new_token_ids
            if ids:
                tokens += len(ids)
                st.job.raw = None  # the engine accepted it: no DLQ copy will be needed
            if st.job.stream and not st.handed_back and (ids or out.text_delta):
                st.ids.extend(ids)
                st.texts.append(out.text_delta)
                if st.index == 0 or len(st.ids) >= self.max_tokens:
                    self._flush(st)
                elif not st.dirty:
                    st.dirty = True
                    if not self._dirty:
                        self._next_flush = time.monotonic() + self.interval_s
                    self._dirty.append(st)
            if out.finished:
                self._finish(st, out)
        if tokens:
            self.metrics.inc("tokens_out", tokens)

    # -- token deltas -------------------------------------------------------------------------
    def _flush(self, st: _Stream) -> None:
        job = st.job
        value = event_bytes.token_event(job.request_id, job.attempt, st.index, st.start,
                                        st.ids, "".join(st.texts))
        st.index += 1
        st.start += len(st.ids)
        st.ids, st.texts, st.dirty = [], [], False
        self._send_untracked(self.topic_tokens, st.key, value)
        self.metrics.inc("token_events")

    def _flush_all(self) -> None:
        for st in self._dirty:
            if st.dirty:
                self._flush(st)
        self._dirty = []

    def _send_untracked(self, topic: str, key: bytes, value: bytes) -> None:
        try:
            self.producer.send(topic, key=key, value=value).add_errback(self._on_error, None, 0)
        except Exception as exc:  # noqa: BLE001 - KafkaTimeoutError & co: never fatal here
            self._untracked_failed(exc)

    def _untracked_failed(self, exc: BaseException) -> None:
        self.metrics.inc("send_errors")
        self._warn("a token/status event was not delivered (%s); streams complete from the "
                   "final event", exc)

    # -- endings ----------------------------------------------------------------------------
    def _finish(self, st: _Stream, out: Any) -> None:
        job = st.job
        del self.streams[job.attempt]
        if st.handed_back:
            self.settled.put((job.ticket, DROPPED))
            return
        self.settled.put((job.ticket, FINISHED))
        if st.dirty or st.ids or st.texts:
            self._flush(st)
        if out.finish_reason == "error":
            self._engine_error(st, getattr(out, "error_code", None) or ERR_ENGINE,
                               out.error or "the engine failed this request")
            return
        try:
            lps, prompt_lps = (self.shape_logprobs(out) if self.shape_logprobs is not None
                               else (None, None))
            value = event_bytes.final_event(job.request_id, job.attempt, out, worker=self.worker,
                                            batch_id=job.batch_id, submitted_at=job.submitted_at,
                                            queued_at=job.queued_at, logprobs=lps,
                                            prompt_logprobs=prompt_lps)
        except (orjson.JSONEncodeError, TypeError) as exc:
            self._engine_error(st, ERR_INTERNAL, f"the final event could not be encoded: {exc}")
            return
        self.metrics.inc("cancelled" if out.finish_reason == "abort" else "completed")
        ending = _Ending(job.ticket, job.request_id, job.attempt, job.batch_id,
                         [_Message(self.topic_results, st.key, value, None, FINAL)])
        if len(value) > self.max_bytes:  # known now: no need to ask the producer
            self._replace_final(ending, ending.messages[0], _too_large_text(len(value), self.max_bytes))
        self._track(ending)

    def _engine_error(self, st: _Stream, code: str, message: str) -> None:
        """The engine failed the request: input problems go to the DLQ, its own do not."""
        job = st.job
        raw = job.raw if code != ERR_ENGINE else None
        self._reject(Rejected(job.ticket, job.request_id, code, message, None, job.batch_id,
                              job.source, raw, job.headers, job.key, job.attempt))

    def _reject(self, r: Rejected) -> None:
        key = r.request_id.encode() if r.request_id is not None else None
        value = event_bytes.error_event(r.request_id, r.attempt, r.code, r.message,
                                        field=r.field, worker=self.worker, batch_id=r.batch_id)
        messages = [_Message(self.topic_results, key, value, None, FINAL)]
        if r.raw is not None:
            headers = dlq_headers(r.headers, r.code, r.message, r.source)
            body, headers = dlq_value(r.raw, headers, self.max_bytes)
            messages.append(_Message(self.settings.topic_dlq, key or r.key, body, headers, DLQ))
            self.metrics.inc("dlq")
        self.metrics.inc("failed")
        log.info("rejected %s (%s): %s", r.request_id or "<no id>", r.code, r.message[:500])
        self._track(_Ending(r.ticket, r.request_id, r.attempt, r.batch_id, messages))

    def _aborted(self, a: Aborted) -> None:
        key = a.request_id.encode()
        value = event_bytes.abort_event(a.request_id, a.attempt, worker=self.worker,
                                        batch_id=a.batch_id, submitted_at=a.submitted_at,
                                        queued_at=a.queued_at, now=time.time())
        self.metrics.inc("cancelled")
        self._track(_Ending(a.ticket, a.request_id, a.attempt, a.batch_id,
                            [_Message(self.topic_results, key, value, None, FINAL)]))

    # -- tracked sends ------------------------------------------------------------------------
    def _track(self, ending: _Ending) -> None:
        self.endings[ending.ticket] = ending
        for i in range(len(ending.messages)):
            self._send(ending.ticket, i)

    def _send(self, ticket: int, i: int) -> None:
        msg = self.endings[ticket].messages[i]
        msg.tries += 1
        try:
            fut = self.producer.send(msg.topic, key=msg.key, value=msg.value, headers=msg.headers)
        except Exception as exc:  # noqa: BLE001 - sorted into permanent / transient below
            self._failed(ticket, i, exc)
            return
        # NOTE: callbacks run on the producer's I/O thread; they only enqueue.
        fut.add_callback(self._on_ack, ticket, i)
        fut.add_errback(self._on_error, ticket, i)

    def _on_ack(self, ticket: int, i: int, _metadata: Any) -> None:
        self._acks.put((ticket, i, None))

    def _on_error(self, ticket: int, i: int, exc: BaseException) -> None:
        self._acks.put((ticket, i, exc))

    def _drain_acks(self, wait: float = 0.0) -> None:
        acks = self._acks
        try:
            item = acks.get(timeout=wait) if wait else acks.get_nowait()
        except queue.Empty:
            return
        while True:
            ticket, i, exc = item
            ending = self.endings.get(ticket)
            if ticket is None:
                self._untracked_failed(exc)
            elif ending is not None and not ending.messages[i].done:
                if exc is None:
                    self._done(ending, i)
                else:
                    self._failed(ticket, i, exc)
            try:
                item = acks.get_nowait()
            except queue.Empty:
                return

    def _done(self, ending: _Ending, i: int) -> None:
        ending.messages[i].done = True
        if ending.remaining == 0:
            del self.endings[ending.ticket]
            self.settled.put((ending.ticket, ACKED))

    def _failed(self, ticket: int, i: int, exc: BaseException) -> None:
        ending = self.endings[ticket]
        msg = ending.messages[i]
        if isinstance(exc, REFUSED):
            self.metrics.inc("send_errors")
            if msg.kind == FINAL:
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
        self._warn("publishing for %s failed (%s); retrying in %.1fs", ending.request_id, exc,
                   delay)
        heapq.heappush(self._retries, (time.monotonic() + delay, next(self._seq), ticket, i))

    def _replace_final(self, ending: _Ending, msg: _Message, text: str,
                       code: str = ERR_MESSAGE_TOO_LARGE) -> None:
        msg.value = event_bytes.error_event(ending.request_id, ending.attempt, code, text,
                                            field=None, worker=self.worker,
                                            batch_id=ending.batch_id)
        msg.kind = LAST

    def _retry_due(self) -> None:
        now = time.monotonic()
        while self._retries and self._retries[0][0] <= now:
            _, _, ticket, i = heapq.heappop(self._retries)
            if ticket in self.endings and not self.endings[ticket].messages[i].done:
                self._send(ticket, i)

    def _warn(self, fmt: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self._last_warning >= 1.0:  # at most one a second: failures come in floods
            self._last_warning = now
            log.warning(fmt, *args)


def _too_large_text(size: int, limit: int | None) -> str:
    over = f"over the limit of {limit} bytes" if limit else "more than Kafka accepts"
    return (f"the result is too large to publish: its final event is {size} bytes, {over} "
            "(INFLIGHT_KAFKA_MAX_MESSAGE_BYTES, and the broker's message.max.bytes); lower "
            "max_tokens or raise both limits")
