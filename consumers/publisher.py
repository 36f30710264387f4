"""The publisher thread: engine outputs in, events out, acknowledgements back to the intake.

    Admitted ─► StatusEvent (inflight.results)
    step outputs ─► engine metrics (vLLM's histograms: TTFT, inter-token latency, e2e)
                 ─► per request: new tokens gathered into one delta ─► TokenEvent
                    (inflight.results.tokens), flushed every stream_interval_ms, at
                    stream_max_tokens, at once for the first delta (time to first token)
                    and before the final; only for requests that stream
                 ─► finished: FinalEvent, or an ErrorEvent (+ DLQ copy when the input was
                    at fault) on inflight.results, tracked until Kafka acknowledges it
    acks (consumers.tracked_sends) ─► the ticket's last message acknowledged ─► the intake commits

What comes in is one of consumers.thread_messages' PublisherCommands, each handled by the
method its type maps to (`handle`); what goes back to the intake is `Settled(ticket, state)`.

NOTE (backpressure): the queue itself is unbounded, and never blocks anyone putting into
it. The intake's commands are bounded by its own limits (every one belongs to a job it
holds); engine steps are bounded by `steps` (Slots): the engine loop takes a slot per step
and waits, in bounded slices, while all are taken. Once STEPS_BEHIND steps wait here the
publisher is `behind`, and the intake stops admitting (partitions paused) but goes on
polling, so a slow or stalled broker never costs the worker its place in the group.

Events are encoded by consumers.event_bytes (orjson on plain values, no pydantic). Endings
(final events, DLQ copies) are tracked until acknowledged by consumers.tracked_sends, which
also deals with send failures. Token deltas and status events are not tracked: a lost one is
counted and logged; streams complete from the final event, which carries the whole text.
Partitions are picked here, by transport.partitioner (the rule every reader of a request's
events follows).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import orjson

from inflight.consumers import event_bytes, request_spans
from inflight.consumers.dlq import dlq_headers, dlq_value
from inflight.consumers.engine_bridge import LogprobShaper
from inflight.consumers.engine_metrics import EngineMetrics
from inflight.consumers.metrics import Metrics
from inflight.consumers.thread_messages import (Aborted, AddFailed, Admitted, HandBack,
                                                PublisherCommand, Rejected, Settled, Slots,
                                                StepOutputs, StopPublishing, TicketState)
from inflight.consumers.tracked_sends import DLQ, FINAL, REPLY, Ending, Message, TrackedSends
from inflight.schemas import ERR_ENGINE, ERR_INTERNAL, ERR_INVALID_REQUEST, Settings
from inflight.schemas.headers import event_headers
from inflight.schemas.tools import parse_tool_calls
from inflight.transport import tracing
from inflight.transport.partitioner import key_hash, partition_of
from inflight.transport.results_producer import ResultsProducer

if TYPE_CHECKING:
    from inflight.engine.outputs import RequestOutput

log = logging.getLogger("inflight.worker")

QUEUE_SIZE = 1024          # engine steps waiting to be published, at most
STEPS_BEHIND = 256         # ... from this many on, the intake admits nothing new
BATCH = 256                # commands handled before acks, retries and flushes get a turn
ACK_POLL_S = 0.005         # how often acks are looked at while some are outstanding
IDLE_S = 0.1


@dataclass(slots=True)
class _Stream:
    """Publishing state of one admitted attempt."""

    job: Admitted
    key: bytes
    hash: int                      # transport.partitioner.key_hash: partitions come from it
    live: bool                     # deltas wanted: the request streams, not handed back
    raw: bytes | None              # the DLQ copy should the engine refuse the input (None
                                   # from its first token on: the engine took it)
    headers: list[tuple[str, bytes]]  # of each of its events (schemas.headers.event_headers)
    reply_to: str | None = None    # a topic that gets its final (and deltas) too
    index: int = 0                 # token events sent
    start: int = 0                 # tokens sent in them
    ids: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    lps: list | None = None        # the delta's logprob entries (the request asked for them)
    dirty: bool = False
    handed_back: bool = False
    last_at: float = 0.0           # when its last token came (0: none yet), for the metrics


class EventPublisher:
    """The worker's publisher thread (module docstring): engine outputs and intake commands
    in, events on the results topics out."""

    def __init__(self, settings: Settings, producer: ResultsProducer | None,
                 settled: queue.SimpleQueue[Settled], *, worker: str, metrics: Metrics,
                 engine_metrics: EngineMetrics | None = None,
                 logprobs: LogprobShaper | None = None, model: str | None = None):
        """`producer`: None until the worker opens (set `producer` before start());
        `logprobs`: the shaper of the engine's tokenizer (None: requests that asked for
        logprobs get none); `model`: the served model id, on every final event."""
        self.settings = settings
        self.model = model
        self.settled = settled
        self.worker = worker
        self.metrics = metrics
        self.engine_metrics = engine_metrics
        self.shape_logprobs = logprobs
        self.queue: queue.SimpleQueue[PublisherCommand] = queue.SimpleQueue()
        self.steps = Slots(QUEUE_SIZE)
        self.topic_results = settings.topic_results
        self.topic_tokens = settings.topic_results_tokens
        self.interval_s = settings.stream_interval_ms / 1000.0
        self.max_tokens = settings.stream_max_tokens
        self.max_bytes = settings.kafka_max_message_bytes
        self.streams: dict[str, _Stream] = {}        # by attempt
        self.tracked = TrackedSends(settled, worker=worker, metrics=metrics,
                                    max_bytes=settings.kafka_max_message_bytes)
        # OpenTelemetry (transport/tracing.py): None while off, so nothing is traced
        self.tracer = tracing.tracer(settings, "inflight.worker")
        self._dirty: list[_Stream] = []
        self._token_events = 0
        self._num_partitions: dict[str, int] = {}
        self._next_flush = 0.0
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None
        self._handlers: dict[type, Callable[[Any], None]] = {
            StepOutputs: self._step, Admitted: self._admit, Rejected: self._reject,
            Aborted: self._aborted, HandBack: self._hand_back, AddFailed: self._add_failed}
        if producer is not None:
            self.producer = producer

    @property
    def producer(self) -> ResultsProducer:
        return self._producer

    @producer.setter
    def producer(self, producer: ResultsProducer) -> None:
        self._producer = self.tracked.producer = producer

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> "EventPublisher":
        self.thread = threading.Thread(target=self.run, name="publisher", daemon=True)
        self.thread.start()
        return self

    @property
    def behind(self) -> bool:
        """Engine steps pile up unpublished (a slow or stalled broker): admit nothing new."""
        return self.steps.used >= STEPS_BEHIND

    def stop(self, ack_timeout: float = 10.0) -> None:
        """Flush, wait up to `ack_timeout` seconds for outstanding acknowledgements, exit."""
        if self.thread is None or not self.thread.is_alive():
            return
        self.queue.put(StopPublishing(ack_timeout))

    def join(self, timeout: float | None = None) -> bool:
        if self.thread is not None:
            self.thread.join(timeout)
            return not self.thread.is_alive()
        return True

    def run(self) -> None:
        try:
            ack_timeout = self._loop()
            self._flush_all()
            self.tick()
            deadline = time.monotonic() + ack_timeout
            while self.tracked and time.monotonic() < deadline:
                self.tracked.drain_acks(wait=ACK_POLL_S)
                self.tracked.retry_due()
            if self.tracked:
                log.warning("%d final event(s) unacknowledged at shutdown; their requests "
                            "are redone by the group", len(self.tracked))
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
                if type(item) is StopPublishing:
                    return item.ack_timeout
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
        if self.tracked:
            wait = min(wait, ACK_POLL_S)
        retry = self.tracked.next_retry
        if retry is not None:
            wait = min(wait, max(retry - now, 0.0))
        return wait

    def tick(self) -> None:
        """Acks, due retries and due flushes (after each batch of commands)."""
        self.tracked.drain_acks()
        self.tracked.retry_due()
        if self._dirty and time.monotonic() >= self._next_flush:
            self._flush_all()
        if self._token_events:
            self.metrics.inc("token_events", self._token_events)
            self._token_events = 0

    # -- commands ---------------------------------------------------------------------------
    def handle(self, item: PublisherCommand) -> None:
        """One command, by the method its type maps to (StopPublishing ends _loop first)."""
        self._handlers[type(item)](item)

    def _step(self, step: StepOutputs) -> None:
        try:
            self._outputs(step.outputs, step.at)
        finally:
            self.steps.give()

    def _hand_back(self, cmd: HandBack) -> None:
        st = self.streams.get(cmd.attempt)
        if st is not None:
            st.handed_back, st.live, st.ids, st.texts = True, False, [], []

    def _add_failed(self, cmd: AddFailed) -> None:
        st = self.streams.pop(cmd.attempt, None)
        if st is not None:
            self.settled.put(Settled(st.job.ticket, TicketState.FINISHED))
            self._engine_error(st, ERR_INVALID_REQUEST, cmd.message)

    def _admit(self, job: Admitted) -> None:
        key = job.request_id.encode()
        # NOTE: the raw request is kept on the stream alone, so that it is freed at the
        # first token (the engine took the input: no DLQ copy can be needed any more)
        st = self.streams[job.attempt] = _Stream(
            replace(job, raw=None), key, key_hash(key), job.stream, job.raw,
            event_headers(job.headers, job.request_id, job.tenant), job.reply_to)
        self._send_untracked(self.topic_results, key, event_bytes.status_event(
            job.request_id, job.attempt, self.worker, job.queued_at),
            self._partition(self.topic_results, st.hash), st.headers)

    def _outputs(self, outputs: list[RequestOutput], now: float) -> None:
        """One engine step's outputs (`now`: when the step returned): token deltas, endings,
        and the engine metrics (vLLM's TTFT, inter-token latency, e2e, token counters).

        NOTE: the hot loop (one pass per output of every step, i.e. per token at GPU
        rates): plain attribute work only. The engine metrics are gathered in this same
        pass (a second pass over the outputs cost about as much as this one): per
        request only at its first token and at its end; the
        inter-token gaps by the previous token's time, kept on the stream (most requests
        of a step share it), recorded once per step."""
        streams, tokens, max_tokens = self.streams, 0, self.max_tokens
        gaps: dict[float, int] = {}
        em = self.engine_metrics
        for out in outputs:
            st = streams.get(out.request_id)
            if st is None:
                self._unknown_output(out)
                continue
            ids = out.new_token_ids
            if ids:
                tokens += len(ids)
                prev = st.last_at
                if prev:
                    gaps[prev] = gaps.get(prev, 0) + 1
                    st.last_at = now
                else:  # its first token(s): the engine accepted it, no DLQ copy is needed
                    st.raw = None
                    st.last_at = em.observe_first(out, now) if em is not None else now
            if st.live and (ids or out.text_delta):
                st.ids += ids
                st.texts.append(out.text_delta)
                if out.logprobs is not None and ids and self.shape_logprobs is not None:
                    # a final output carries all its logprobs: the delta's are the last ones
                    lps = out.logprobs[-len(ids):] if out.finished else out.logprobs
                    if st.lps is None:
                        st.lps = []
                    st.lps += [self.shape_logprobs.position(e) for e in lps]
                if st.index == 0 or len(st.ids) >= max_tokens:
                    self._flush(st)
                elif not st.dirty:
                    st.dirty = True
                    if not self._dirty:
                        self._next_flush = time.monotonic() + self.interval_s
                    self._dirty.append(st)
            if out.finished:
                if em is not None:
                    em.observe_finished(out)
                self._finish(st, out)
        if tokens:
            self.metrics.inc("tokens_out", tokens)
        if em is not None:
            em.observe_tokens(tokens, gaps, now)

    def _unknown_output(self, out: RequestOutput) -> None:
        """An output of an attempt with no stream (its add failed): counted, nothing sent."""
        em = self.engine_metrics
        if em is not None:
            em.observe_tokens(len(out.new_token_ids), {}, 0.0)
            if out.finished:
                em.observe_finished(out)

    # -- token deltas -------------------------------------------------------------------------
    def _flush(self, st: _Stream) -> None:
        job = st.job
        value = event_bytes.token_event(job.request_id, job.attempt, st.index, st.start,
                                        st.ids, "".join(st.texts), st.lps)
        st.index += 1
        st.start += len(st.ids)
        st.ids, st.texts, st.dirty = [], [], False
        if st.lps is not None:
            st.lps = []
        self._send_untracked(self.topic_tokens, st.key, value,
                             self._partition(self.topic_tokens, st.hash), st.headers)
        if st.reply_to is not None:
            self._send_untracked(st.reply_to, st.key, value,
                                 self._partition(st.reply_to, st.hash), st.headers)
        self._token_events += 1  # added in tick(): a Metrics.inc per delta costs more

    def _flush_all(self) -> None:
        for st in self._dirty:
            if st.dirty:
                self._flush(st)
        self._dirty = []

    def _partition(self, topic: str, h: int) -> int | None:
        """The partition of a key whose transport.partitioner.key_hash is `h` (None: the
        topic's partitions are unknown now; the producer picks by the same rule).

        NOTE: given to send() explicitly, so the pure-Python murmur2 runs once per request
        instead of once per message (it cost about as much as the rest of send())."""
        n = self._num_partitions.get(topic)
        if n is None:
            try:
                n = len(self.producer.partitions_for(topic) or ())
            except Exception:  # noqa: BLE001 - unknown now: let the producer pick
                return None
            if not n:
                return None
            self._num_partitions[topic] = n
        return partition_of(h, n)

    def _send_untracked(self, topic: str, key: bytes, value: bytes,
                        partition: int | None = None,
                        headers: list[tuple[str, bytes]] | None = None) -> None:
        try:
            # librdkafka: no Python call at all for a successful untracked send
            self.producer.send_untracked(topic, key, value, partition, self._untracked_failed,
                                         headers)
        except Exception as exc:  # noqa: BLE001 - KafkaTimeoutError & co: never fatal here
            self._untracked_failed(exc)

    def _untracked_failed(self, exc: BaseException) -> None:
        self.metrics.inc("send_errors")
        self.tracked.warn("a token/status event was not delivered (%s); streams complete from "
                          "the final event", exc)

    # -- endings ----------------------------------------------------------------------------
    def _finish(self, st: _Stream, out: RequestOutput) -> None:
        job = st.job
        del self.streams[job.attempt]
        if st.handed_back:
            self.settled.put(Settled(job.ticket, TicketState.DROPPED))
            return
        self.settled.put(Settled(job.ticket, TicketState.FINISHED))
        if st.dirty or st.ids or st.texts:
            self._flush(st)
        if out.finish_reason == "error":
            self._engine_error(st, out.error_code or ERR_ENGINE,
                               out.error or "the engine failed this request")
            return
        try:
            lps, prompt_lps = (self.shape_logprobs(out) if self.shape_logprobs is not None
                               else (None, None))
            calls = parse_tool_calls(out.text, job.request_id)[1] if job.tools else []
            value = event_bytes.final_event(job.request_id, job.attempt, out, worker=self.worker,
                                            batch_id=job.batch_id, submitted_at=job.submitted_at,
                                            queued_at=job.queued_at, logprobs=lps,
                                            prompt_logprobs=prompt_lps,
                                            tool_calls=calls or None, model=job.model or self.model,
                                            tenant=job.tenant)
        except (orjson.JSONEncodeError, TypeError) as exc:
            self._engine_error(st, ERR_INTERNAL, f"the final event could not be encoded: {exc}")
            return
        self.metrics.inc({"abort": "cancelled", "expired": "expired"}.get(out.finish_reason,
                                                                          "completed"))
        self.metrics.tenant_tokens(job.tenant, out.num_prompt_tokens, len(out.token_ids))
        spans = None if self.tracer is None else request_spans.finished(
            self.tracer, st.headers, job, out, worker=self.worker, model=self.model,
            topic=self.topic_results)
        self.tracked.track(Ending(job.ticket, job.request_id, job.attempt, job.batch_id,
                                  self._finals(st.key, value, st.headers, st.hash,
                                               st.reply_to), spans))

    def _engine_error(self, st: _Stream, code: str, message: str) -> None:
        """The engine failed the request: input problems go to the DLQ, its own do not."""
        job = st.job
        raw = st.raw if code != ERR_ENGINE else None
        self._reject(Rejected(ticket=job.ticket, request_id=job.request_id, code=code,
                              message=message, field=None, batch_id=job.batch_id,
                              source=job.source, raw=raw, headers=job.headers, key=job.key,
                              attempt=job.attempt, model=job.model or self.model,
                              tenant=job.tenant, reply_to=st.reply_to))

    def _reject(self, r: Rejected) -> None:
        key = r.request_id.encode() if r.request_id is not None else None
        value = event_bytes.error_event(r.request_id, r.attempt, r.code, r.message,
                                        field=r.field, worker=self.worker, batch_id=r.batch_id,
                                        model=r.model, tenant=r.tenant)
        headers = event_headers(r.headers, r.request_id, r.tenant)
        if key is None:
            messages = [Message(self.topic_results, key, value, headers, FINAL, None)]
        else:
            messages = self._finals(key, value, headers, key_hash(key), r.reply_to)
        if r.raw is not None:
            headers = dlq_headers(r.headers, r.code, r.message, r.source)
            body, headers = dlq_value(r.raw, headers, self.max_bytes)
            messages.append(Message(self.settings.topic_dlq, key or r.key, body, headers, DLQ))
            self.metrics.inc("dlq")
        self.metrics.inc("failed")
        log.info("rejected %s (%s): %s", r.request_id or "<no id>", r.code, r.message[:500])
        spans = None if self.tracer is None or r.request_id is None else (
            request_spans.ended_without_running(
                self.tracer, r.headers, r.request_id, r.attempt, code=r.code, message=r.message,
                worker=self.worker, topic=self.topic_results))
        self.tracked.track(Ending(r.ticket, r.request_id, r.attempt, r.batch_id, messages, spans))

    def _aborted(self, a: Aborted) -> None:
        key = a.request_id.encode()
        value = event_bytes.abort_event(a.request_id, a.attempt, worker=self.worker,
                                        batch_id=a.batch_id, submitted_at=a.submitted_at,
                                        queued_at=a.queued_at, now=time.time(),
                                        model=a.model or self.model, finish_reason=a.finish_reason,
                                        tenant=a.tenant)
        self.metrics.inc("cancelled" if a.finish_reason == "abort" else a.finish_reason)
        spans = None if self.tracer is None else request_spans.ended_without_running(
            self.tracer, a.headers, a.request_id, a.attempt,
            code="cancelled" if a.finish_reason == "abort" else a.finish_reason,
            message="cancelled before it ran" if a.finish_reason == "abort"
            else "its deadline passed before it ran", worker=self.worker, topic=self.topic_results)
        self.tracked.track(Ending(a.ticket, a.request_id, a.attempt, a.batch_id,
                                  self._finals(key, value,
                                               event_headers(a.headers, a.request_id, a.tenant),
                                               key_hash(key), a.reply_to), spans))

    def _finals(self, key: bytes, value: bytes, headers: list[tuple[str, bytes]], h: int,
                reply_to: str | None) -> list[Message]:
        """The tracked copies of one final event: on the results topic, and on the request's
        reply_to topic (one ending: the ticket settles when Kafka acknowledged both)."""
        out = [Message(self.topic_results, key, value, headers, FINAL,
                       self._partition(self.topic_results, h))]
        if reply_to is not None:
            out.append(Message(reply_to, key, value, headers, REPLY,
                               self._partition(reply_to, h)))
        return out
