"""The intake thread: it owns the group consumer (kafka-python's consumer is not
thread-safe: poll, pause/resume, seek and commit all happen here, and nowhere else).

    poll ─► decode/validate ─► admit (publisher: Admitted; engine loop: AddRequest)
      │       └─ bad input ─► publisher: Rejected (error final + DLQ copy)
      ├─ pause every partition at the in-flight limit, while the publisher is behind (a
      │  slow or stalled broker) and while draining -- polling all along, so the worker
      │  stays in its group; the batch topic while interactive traffic keeps coming
      ├─ settled tickets (Settled, from the publisher) ─► watermark ─► commit on a timer
      │  (consumers/watermark_commits.py)
      └─ rebalances: forget revoked offsets; hand back work whose partition moved

NOTE (watermark): a ticket is settled only when Kafka acknowledged every message of its
ending (final event, DLQ copy). Its offsets -- the first copy and any redelivered
duplicate, which attaches to the running job instead of being marked done -- are marked
done only then, so no commit ever passes a request whose final is unacknowledged, across
rebalances too: a revoke drops the job's offsets of those partitions (the tracker forgets
them), and a redelivery after the partition comes back attaches again.

NOTE (never blocked): nothing on this thread waits without a short bound, so it polls at
least every max.poll.interval.ms whatever the broker does: commands to the publisher go on
an unbounded queue (bounded by the jobs held here), the periodic commit is asynchronous
(one in flight at a time), and the cancel listener never blocks.
"""

from __future__ import annotations

import itertools
import logging
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass
from kafka import KafkaConsumer, TopicPartition
from kafka.consumer.fetcher import ConsumerRecord
from kafka.consumer.subscription_state import ConsumerRebalanceListener

from inflight.consumers.cancel import CancelledBatches, CancelListener
from inflight.consumers.engine_loop import EngineLoop
from inflight.consumers.engine_bridge import chat_inputs
from inflight.consumers.engine_metrics import EngineMetrics
from inflight.consumers.kafka_io import LRUSet, close_without_leaving, group_consumer
from inflight.consumers.metrics import Metrics
from inflight.consumers.offsets import OffsetTracker
from inflight.consumers.reply_to import ReplyTopics
from inflight.consumers.served_model import Serving
from inflight.consumers.thread_messages import (Aborted, Admitted, HandBack, PartitionsAssigned,
                                                PartitionsRevoked, PublisherCommand, Rebalance,
                                                Rejected, Settled, TicketState)
from inflight.consumers.watermark_commits import WatermarkCommits
from inflight.schemas import SchemaError, Settings, decode_request
from inflight.schemas.base import ID_RE
from inflight.schemas.events import (ERR_INVALID_REQUEST, ERR_MODEL_NOT_FOUND, ERR_REPLY_TO_REFUSED,
                                     ERR_WRONG_MODEL_KIND)

log = logging.getLogger("inflight.worker")

PRUNE_EVERY_S = 1.0      # forget batch cancels older than the lookback window
POLL_WAIT_MS = 50        # with room: how long a poll may wait for records
SETTLE_WAIT_S = 0.05     # full (or draining): how long to wait for a settled ticket
MAX_ENDINGS_FACTOR = 2   # jobs held in all (running + awaiting acks) <= this x max_inflight
RECENT_IDS = 100_000     # finished request ids remembered to skip duplicates
CANCELLED_IDS = 10_000   # cancelled request ids remembered (a batch's: CancelledBatches)


@dataclass(slots=True)
class Job:
    """What the intake remembers of one ticket until it is settled or dropped."""

    ticket: int
    request_id: str | None
    attempt: str | None                     # None: nothing runs in the engine for it
    home: TopicPartition                    # where it was first read
    sources: list[tuple[TopicPartition, int]]  # offsets its ending settles
    running: bool = False                   # in the engine (counts against the limit)
    handed_back: bool = False
    batch_id: str | None = None


def key_request_id(key: bytes | None) -> str | None:
    """A record key that is a well-formed request id (the fallback for unparsable bodies)."""
    if not key:
        return None
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text if ID_RE.match(text) else None


class Intake:
    def __init__(self, settings: Settings, engine: EngineLoop,
                 publish: queue.SimpleQueue[PublisherCommand],
                 settled: queue.SimpleQueue[Settled], *, attempt_prefix: str, max_inflight: int,
                 metrics: Metrics, serving: Serving,
                 engine_metrics: EngineMetrics | None = None,
                 publisher_behind: Callable[[], bool] = lambda: False,
                 template_takes_tools: bool = False):
        """`serving`: the model this worker serves, the topics and group it reads;
        `template_takes_tools`: the engine's chat template renders tool definitions (they
        are handed to it instead of rendered into the messages here)."""
        self.settings = settings
        self.serve(serving)
        self.engine = engine
        self.publish = publish
        self.settled = settled
        self.attempt_prefix = attempt_prefix
        self.max_inflight = max_inflight
        self.metrics = metrics
        self.engine_metrics = engine_metrics
        self.publisher_behind = publisher_behind
        self.template_takes_tools = template_takes_tools
        # NOTE: `running` (jobs in the engine) is what the in-flight limit bounds; endings
        # waiting for their acks are bounded apart, by as many again (MAX_ENDINGS_FACTOR).
        self.jobs: dict[int, Job] = {}
        self.running = 0
        self.by_id: dict[str, Job] = {}      # admitted request ids still running or unacked
        self.tracker = OffsetTracker()
        self.owned: set[TopicPartition] = set()  # partitions assigned, as the listener says
        self.recent = LRUSet(RECENT_IDS)
        self.cancelled = LRUSet(CANCELLED_IDS)
        self.cancelled_batches = CancelledBatches(settings.cancel_lookback_s)
        self.max_seen_inflight = 0
        self.draining = False
        self.consumer: KafkaConsumer | None = None
        self.cancels: CancelListener | None = None
        self._tickets = itertools.count(1)
        self._rebalances: queue.SimpleQueue[Rebalance] = queue.SimpleQueue()
        self._interactive_busy = False
        self._next_cancels = 0.0
        self.commits = WatermarkCommits(self.tracker, metrics)
        self.reply_topics = ReplyTopics(settings)

    # -- lifecycle ------------------------------------------------------------------------
    def serve(self, serving: Serving) -> None:
        """The model and topics this intake reads (before `open`)."""
        self.serving = serving
        self.topics = serving.topics

    def open(self) -> "Intake":
        s = self.settings
        self.consumer = group_consumer(s, self.topics.group, max_poll_records=self.max_inflight)
        self.consumer.subscribe([self.topics.requests, self.topics.batch],
                                listener=_Rebalance(self._rebalances))
        self.cancels = CancelListener(s)  # from now - INFLIGHT_CANCEL_LOOKBACK_S
        return self

    def close(self) -> None:
        """Close the cancel reader and the group consumer; the group takes this worker's
        partitions when its session expires (see kafka_io.close_without_leaving)."""
        for close in (self.cancels and self.cancels.close,
                      self.consumer and (lambda: close_without_leaving(self.consumer))):
            if close:
                try:
                    close()
                except Exception:  # noqa: BLE001 - closing must not mask the real error
                    log.exception("closing the intake failed")
        self.cancels = self.consumer = None

    @property
    def in_flight(self) -> int:
        """Requests in the engine (what INFLIGHT_WORKER_MAX_INFLIGHT bounds)."""
        return self.running

    @property
    def room(self) -> int:
        return min(self.max_inflight - self.running,
                   MAX_ENDINGS_FACTOR * self.max_inflight - len(self.jobs))

    # -- one round --------------------------------------------------------------------------
    def run_once(self) -> None:
        self._handle_rebalances()
        self._drain_settled()
        # every round: the cancel reader's own thread has read them (consumers/cancel.py),
        # so taking them costs no wait, and a batch's cancel stops its admission at once
        for cancel, at in self.cancels.poll():
            if cancel.lora is not None:
                self._lora(cancel.lora)
            elif cancel.batch_id is not None:
                self._cancel_batch(cancel.batch_id, at)
            else:
                self._cancel(cancel.request_id)
        now = time.monotonic()
        if now >= self._next_cancels:
            self._next_cancels = now + PRUNE_EVERY_S
            self.cancelled_batches.prune()
        room = self.room
        behind = self.publisher_behind()
        closed = room <= 0 or self.draining or behind
        self._apply_pause(closed)
        self.metrics.set("publisher_behind", int(behind))
        if closed:
            # Nothing may be admitted: wait for a settle, then poll without waiting so the
            # consumer still heartbeats and takes part in rebalances.
            self._wait_settled(SETTLE_WAIT_S)
            records = self.consumer.poll(timeout_ms=0, max_records=1)
        else:
            records = self.consumer.poll(timeout_ms=POLL_WAIT_MS, max_records=room)
        self._handle_rebalances()
        if closed:
            if records:  # from a partition assigned during this poll, before it was paused
                self._put_back(records)
        else:
            self._receive_all(records)
        self.commits.apply_outcomes()
        if self.commits.due:
            self.commit(wait=False)
        self.metrics.set("in_flight", self.running)
        self.metrics.set("commit_lag", self.tracker.lag)
        self.metrics.maybe_log()

    def _apply_pause(self, closed: bool) -> None:
        """Pause everything at the limit or while draining (`closed`); pause the batch topic
        while interactive work keeps coming (batch requests only take spare capacity)."""
        assigned = self.consumer.assignment()
        if closed:
            want = set(assigned)
        elif self._interactive_busy:
            want = {tp for tp in assigned if tp.topic != self.topics.requests}
        else:
            want = set()
        paused = self.consumer.paused()
        if want - paused:
            self.consumer.pause(*(want - paused))
        if paused - want:
            self.consumer.resume(*(paused - want))
        self.metrics.set("paused_partitions", len(want))

    # -- records ----------------------------------------------------------------------------
    def _receive_all(self, records: dict[TopicPartition, list[ConsumerRecord]]) -> None:
        interactive = False
        now = time.time()
        for tp, recs in records.items():
            interactive |= tp.topic == self.topics.requests
            for rec in recs:
                self._receive(tp, rec, now)
        self._interactive_busy = interactive
        self.max_seen_inflight = max(self.max_seen_inflight, self.running)

    def _put_back(self, records: dict[TopicPartition, list[ConsumerRecord]]) -> None:
        """Records that may not be admitted now: read them again from the first one (a
        later commit can never pass them: they are not in the watermark)."""
        for tp, recs in records.items():
            self.consumer.seek(tp, recs[0].offset)

    def _receive(self, tp: TopicPartition, rec: ConsumerRecord, now: float) -> None:
        self.metrics.inc("received")
        self.tracker.add(tp, rec.offset)
        s = self.settings
        try:
            req = decode_request(rec.value, max_bytes=s.kafka_max_message_bytes,
                                 max_prompt_chars=s.max_prompt_chars)
        except SchemaError as exc:
            rid = exc.request_id or key_request_id(rec.key)
            self._reject(tp, rec, rid, exc.code, exc.message, exc.field, None)
            return
        rid = req.request_id
        if not self.serving.accepts(req.model):  # written to another model's topic
            self._reject(tp, rec, rid, ERR_MODEL_NOT_FOUND,
                         self.serving.refusal(req.model, tp.topic), "model", req.batch_id,
                         model=req.model)
            return
        if req.kind != self.serving.kind:  # an embedding request to a generation model, or the reverse
            self._reject(tp, rec, rid, ERR_WRONG_MODEL_KIND, self.serving.kind_refusal(req.kind),
                         "kind", req.batch_id, model=req.model, tenant=_tenant(req))
            return
        if req.reply_to is not None:
            refusal = self.reply_topics.refusal(req.reply_to)
            if refusal is not None:
                self._reject(tp, rec, rid, ERR_REPLY_TO_REFUSED, refusal, "reply_to",
                             req.batch_id, model=req.model, tenant=_tenant(req))
                return
        if req.tenant is None and s.require_tenant:
            self._reject(tp, rec, rid, ERR_INVALID_REQUEST, "this deployment requires a tenant "
                         "on every request (INFLIGHT_REQUIRE_TENANT): set `tenant`", "tenant",
                         req.batch_id, model=req.model)
            return
        job = self.by_id.get(rid)
        if job is not None or rid in self.recent:
            # Same id again: one run. A running (or unacknowledged) twin settles this
            # offset too, when its own final is acknowledged.
            self.metrics.inc("duplicates")
            if job is not None:
                job.sources.append((tp, rec.offset))
            else:
                self.tracker.done(tp, rec.offset)
            return
        ticket = next(self._tickets)
        attempt = f"{self.attempt_prefix}.{ticket}"
        expires_at = req.expires_at
        expired = expires_at is not None and expires_at <= now
        if expired or rid in self.cancelled or req.batch_id in self.cancelled_batches:
            # NOTE: a request past its deadline ends `expired` here, never reaching the engine
            self._add_job(Job(ticket, rid, None, tp, [(tp, rec.offset)], batch_id=req.batch_id))
            self._publish(Aborted(ticket=ticket, request_id=rid, attempt=attempt,
                                  batch_id=req.batch_id, submitted_at=req.submitted_at,
                                  queued_at=now, headers=list(rec.headers or []),
                                  tenant=_tenant(req), reply_to=req.reply_to,
                                  finish_reason="abort" if not expired else "expired",
                                  model=self.serving.lora_of(req.model).get("lora")))
            return
        params = req.params  # the engine's SamplingParams, validated when decoded
        messages, extra = chat_inputs(req, self.template_takes_tools)
        lora = self.serving.lora_of(req.model)
        uses_tools = req.tools is not None and req.tool_choice != "none"
        self._add_job(Job(ticket, rid, attempt, tp, [(tp, rec.offset)], running=True,
                          batch_id=req.batch_id))
        self.running += 1
        # NOTE: the publisher hears of the attempt before the engine can produce output for it.
        self._publish(Admitted(
            ticket=ticket, request_id=rid, attempt=attempt, stream=req.wants_stream,
            batch_id=req.batch_id, submitted_at=req.submitted_at, queued_at=now,
            source=_source(tp, rec.offset), raw=rec.value, headers=list(rec.headers or []),
            key=rec.key, tools=uses_tools, tenant=_tenant(req), reply_to=req.reply_to,
            model=lora.get("lora")))
        self.engine.add(attempt, prompt=req.prompt, prompt_token_ids=req.prompt_token_ids,
                        params=params, priority=req.priority, messages=messages,
                        arrival_time=now, tenant=req.tenant, deadline=expires_at, **extra, **lora,
                        **({"dimensions": req.dimensions} if req.dimensions is not None else {}))
        self.metrics.inc("admitted")
        if self.engine_metrics is not None:
            self.engine_metrics.observe_queue_time(now - req.submitted_at)

    def _add_job(self, job: Job) -> None:
        self.jobs[job.ticket] = job
        if job.request_id is not None:
            self.by_id[job.request_id] = job

    def _reject(self, tp: TopicPartition, rec: ConsumerRecord, rid: str | None, code: str,
                message: str, field: str | None, batch_id: str | None,
                model: str | None = None, tenant: str | None = None) -> None:
        ticket = next(self._tickets)
        self.jobs[ticket] = Job(ticket, rid, None, tp, [(tp, rec.offset)])
        self._publish(Rejected(
            ticket=ticket, request_id=rid, code=code, message=message, field=field,
            batch_id=batch_id, source=_source(tp, rec.offset),
            raw=rec.value if rec.value is not None else b"", headers=list(rec.headers or []),
            key=rec.key, model=model, tenant=tenant))

    def _publish(self, item: PublisherCommand) -> None:
        """Hand `item` to the publisher (never waits: see the module's NOTE)."""
        self.publish.put(item)

    # -- cancels and LoRA commands -------------------------------------------------------------
    def _lora(self, cmd) -> None:
        """A LoRA load/unload for this worker's model (or every worker's): applied on the
        engine's thread, which updates `serving.adapters` once it succeeds."""
        if cmd.model is not None and cmd.model != self.serving.model:
            return
        lora = getattr(self.engine, "lora", None)
        if lora is None:
            log.warning("LoRA %s of %r ignored: this worker's engine loop takes no adapters",
                        cmd.action, cmd.lora_name)
            return
        lora(cmd, self.serving.adapters)

    def _cancel(self, rid: str) -> None:
        self.cancelled.add(rid)
        job = self.by_id.get(rid)
        if job is not None and job.attempt is not None:
            self.engine.abort(job.attempt)
            log.info("cancelled %s", rid)

    def _cancel_batch(self, batch_id: str, at: float) -> None:
        """Every request of the batch: the running ones are aborted now, the ones still
        queued end `cancelled` when they are read (see _receive)."""
        fresh = batch_id not in self.cancelled_batches
        self.cancelled_batches.add(batch_id, at)
        n = 0
        for job in self.jobs.values():
            if job.batch_id == batch_id and job.attempt is not None and job.running \
                    and not job.handed_back:
                self.engine.abort(job.attempt)
                n += 1
        if fresh:
            log.info("batch %s cancelled: %d running request(s) aborted", batch_id, n)

    # -- settling and commits ---------------------------------------------------------------
    def _wait_settled(self, timeout: float) -> None:
        try:
            first = self.settled.get(timeout=timeout)
        except queue.Empty:
            return
        self._settle(first)
        self._drain_settled()

    def _drain_settled(self) -> None:
        while True:
            try:
                settled = self.settled.get_nowait()
            except queue.Empty:
                return
            self._settle(settled)

    def _settle(self, settled: Settled) -> None:
        """FINISHED: out of the engine; ACKED: its ending is acknowledged, so its offsets
        are done; DROPPED: handed back, ended without publishing anything."""
        job = self.jobs.get(settled.ticket)
        if job is None:
            return
        if job.running:
            job.running = False
            self.running -= 1
        if settled.state is TicketState.FINISHED:
            return
        del self.jobs[settled.ticket]
        if self.by_id.get(job.request_id) is job:
            del self.by_id[job.request_id]
        if settled.state is TicketState.ACKED:
            for tp, offset in job.sources:
                self.tracker.done(tp, offset)
            if job.request_id is not None:
                self.recent.add(job.request_id)

    def commit(self, wait: bool = True) -> None:
        """Commit each owned partition's watermark (consumers.watermark_commits); `wait`:
        synchronously, for at most COMMIT_WAIT_MS (shutdown, tests)."""
        self._handle_rebalances()
        self.commits.commit(self.consumer, wait)

    # -- rebalances and hand-backs ----------------------------------------------------------
    def _handle_rebalances(self) -> None:
        """Apply the listener's events in order. `owned` follows them (eager: all revoked,
        then the whole new set assigned; cooperative: what was lost, then what was added)."""
        assigned = False
        while True:
            try:
                event = self._rebalances.get_nowait()
            except queue.Empty:
                break
            tps = event.partitions
            if type(event) is PartitionsRevoked:
                self.metrics.inc("rebalances")
                self.owned -= tps
                self.tracker.forget(tps)
                for job in self.jobs.values():
                    if job.sources:
                        job.sources = [src for src in job.sources if src[0] not in tps]
            else:
                self.owned |= tps
                assigned = True
        if assigned:
            self._release_orphans()

    def _release_orphans(self) -> None:
        """After an assignment: running work whose partition went to another worker is
        handed back (that worker redoes it); work whose partition came back to us keeps
        running and waits for its redelivery to attach (see _receive)."""
        for job in list(self.jobs.values()):
            if not job.sources and job.home not in self.owned and not job.handed_back:
                self.hand_back(job)

    def hand_back(self, job: Job) -> None:
        """Stop running `job` and publish nothing more for it. An ending already sent still
        settles its offsets when acknowledged; one not sent never will (redone elsewhere)."""
        job.handed_back = True
        if self.by_id.get(job.request_id) is job:
            del self.by_id[job.request_id]
        if job.attempt is None:
            return
        self._publish(HandBack(job.attempt))
        self.engine.abort(job.attempt)
        self.metrics.inc("handed_back")

    def drain(self, timeout: float, stopped: Callable[[], bool] = lambda: False) -> None:
        """SIGTERM: admit nothing more and finish what runs, for at most `timeout` seconds;
        hand back the rest. Keeps polling (every partition paused) throughout, so this
        worker takes part in rebalances and a replacement joining meanwhile gets
        partitions at once."""
        self.draining = True
        deadline = time.monotonic() + timeout
        log.info("draining: %d in flight (up to %.0fs)", len(self.jobs), timeout)
        while self.jobs and time.monotonic() < deadline and not stopped():
            self.run_once()
        left = [job for job in self.jobs.values() if not job.handed_back]
        if left:
            log.info("handing back %d unfinished request(s)", len(left))
        for job in left:
            self.hand_back(job)


class _Rebalance(ConsumerRebalanceListener):
    """NOTE: kafka-python 3 calls this on its I/O thread, where the consumer must not be
    touched: it only queues the change for the intake thread."""

    def __init__(self, events: queue.SimpleQueue[Rebalance]):
        self.events = events

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.events.put(PartitionsRevoked(set(revoked)))

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        log.info("assigned %s", sorted(f"{tp.topic}/{tp.partition}" for tp in assigned))
        self.events.put(PartitionsAssigned(set(assigned)))


def _tenant(req: object) -> str | None:
    """The request's tenant, for its events' inflight-tenant header (None: it names none, or
    the wire has no tenant field)."""
    tenant = getattr(req, "tenant", None)
    return tenant if isinstance(tenant, str) else None


def _source(tp: TopicPartition, offset: int) -> str:
    return f"{tp.topic}/{tp.partition}/{offset}"
