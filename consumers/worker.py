"""The GPU worker: Kafka requests in, `engine.Engine` steps, token and final events out.

One thread runs the loop; the producer's I/O thread only reports acknowledgements back
through a queue:

    poll interactive (batch only with spare capacity) ─► decode ─► engine.add_request
          ▲   pause all partitions at the in-flight limit        │
          │                                                      ▼
    commit watermark ◄── final acked ◄── publish token events / one final event ◄── step()

Delivery (see DESIGN.md): a partition's offset is committed only below every request
whose final event Kafka has acknowledged (consumers.offsets). Bad input gets a final
ErrorEvent, its raw bytes and headers go to the DLQ, and the offset moves on.
Idempotency: a request id already in flight, or finished recently, is not run again.
The worker never talks to the database.

Run it: `inflight worker` or `python -m consumers.worker` (settings from INFLIGHT_*).
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from kafka import TopicPartition
from kafka.consumer.subscription_state import ConsumerRebalanceListener
from kafka.errors import CommitFailedError, KafkaError
from kafka.structs import OffsetAndMetadata

from consumers.cancel import CancelListener
from consumers.engine_bridge import build_engine, engine_params
from consumers.engine_metrics import EngineMetrics
from consumers.kafka_io import LRUSet, group_consumer
from consumers.lag import LagProbe
from consumers.metrics import Metrics
from consumers.offsets import OffsetTracker
from schemas import (ERR_ENGINE, ERR_INVALID_REQUEST,
                     ErrorEvent, FinalEvent, InferenceRequest, SchemaError, Settings, Timings,
                     TokenEvent, Usage, decode_request, encode)
from schemas.errors import InflightError
from schemas.kafka_clients import producer

log = logging.getLogger("inflight.worker")

COMMIT_EVERY_S = 0.2
ENGINE_STATS_EVERY_S = 0.25  # Engine.stats() into the metrics gauges
RECENT_IDS = 100_000  # finished request ids remembered to skip duplicates


class EngineLike(Protocol):
    def add_request(self, request_id: str, prompt: str | None = None,
                    prompt_token_ids: list[int] | None = None, params: Any = None,
                    priority: int = 0, **kw: Any) -> None: ...
    def step(self) -> list[Any]: ...
    def abort(self, request_id: str) -> bool: ...
    def has_unfinished(self) -> bool: ...


@dataclass
class InFlight:
    """One admitted request: where it came from and how far its stream got."""

    request: InferenceRequest
    sources: list[tuple[TopicPartition, int]]  # offsets its final event settles
    queued_at: float
    raw: bytes | None = None            # kept until the engine accepts it (for the DLQ)
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    next_index: int = 0
    handed_back: bool = False           # shutting down: drop, publish nothing


@dataclass
class _Unacked:
    """Messages of one request's ending that Kafka has not acknowledged yet."""

    sources: list[tuple[TopicPartition, int]]
    messages: list[tuple[str, bytes | None, bytes, list]]
    remaining: int
    request_id: str | None


class Worker:
    def __init__(self, settings: Settings, engine: EngineLike, *, name: str | None = None,
                 max_inflight: int | None = None, metrics: Metrics | None = None):
        self.settings = settings
        self.engine = engine
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.max_inflight = max_inflight or settings.worker_max_inflight
        self.metrics = metrics or Metrics("worker", settings.metrics_interval_s)
        model = getattr(getattr(engine, "config", None), "model", None)
        self.engine_metrics = EngineMetrics(self.metrics.registry,
                                            os.path.basename(str(model)) if model else "unknown")
        self._last_stats = 0.0
        self.lag: LagProbe | None = None
        self.inflight: dict[str, InFlight] = {}
        self.tracker = OffsetTracker()
        self.recent = LRUSet(RECENT_IDS)
        self.cancelled = LRUSet(10_000)
        self.max_seen_inflight = 0
        self._acks: queue.SimpleQueue = queue.SimpleQueue()
        self._revoked: queue.SimpleQueue = queue.SimpleQueue()
        self._unacked: dict[int, _Unacked] = {}
        self._ack_ids = 0
        self._stopping = False
        self._interactive_busy = False
        self._last_commit = 0.0
        self._started_at = time.time()
        self.consumer = None
        self.producer = None
        self.cancels: CancelListener | None = None

    # -- lifecycle ------------------------------------------------------------------------
    def stop(self, *_: Any) -> None:
        """Ask the loop to stop (signal-safe): stop polling, drain, commit, leave the group."""
        self._stopping = True

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)

    def open(self) -> "Worker":
        s = self.settings
        self.producer = producer(s)
        self.consumer = group_consumer(s, s.worker_group, max_poll_records=self.max_inflight)
        self.consumer.subscribe([s.topic_requests, s.topic_requests_batch],
                                listener=_Rebalance(self))
        self.cancels = CancelListener(s)  # from now - INFLIGHT_CANCEL_LOOKBACK_S
        if s.metrics_port is not None:
            port = self.metrics.serve(s.metrics_port, s.metrics_host)
            log.info("worker metrics on http://%s:%d/metrics", s.metrics_host, port)
            self.lag = LagProbe(s, s.worker_group, [s.topic_requests, s.topic_requests_batch],
                                self.metrics.registry, s.metrics_lag_interval_s).start()
        log.info("worker %s: group=%s topics=%s,%s max_inflight=%d", self.name, s.worker_group,
                 s.topic_requests, s.topic_requests_batch, self.max_inflight)
        return self

    def run(self) -> None:
        if self.consumer is None:
            self.open()
        try:
            while not self._stopping:
                self.run_once()
            self._shutdown()
        finally:
            self.close()

    def run_once(self) -> None:
        self._drain_acks()
        for rid in self.cancels.poll():
            self._cancel(rid)
        self._poll_requests()
        if self.engine.has_unfinished():
            self._step()
        self._maybe_commit()
        self._update_gauges()
        self.metrics.maybe_log()

    def close(self) -> None:
        for closer in (self.lag, self.cancels, self.consumer, self.producer):
            if closer is not None:
                try:
                    closer.close()
                except Exception:  # noqa: BLE001 - closing must not mask the real error
                    log.exception("closing %s failed", type(closer).__name__)
        self.lag = self.cancels = self.consumer = self.producer = None
        self.metrics.close()

    def _shutdown(self) -> None:
        """Graceful stop: no more polling; finish in-flight work within the drain timeout,
        hand the rest back (uncommitted, so the group redoes it), commit, leave the group."""
        assigned = self.consumer.assignment()
        if assigned:
            self.consumer.pause(*assigned)
        deadline = time.monotonic() + self.settings.worker_drain_timeout_s
        log.info("worker %s stopping: %d in flight (drain up to %.0fs)", self.name,
                 len(self.inflight), self.settings.worker_drain_timeout_s)
        while self.inflight and time.monotonic() < deadline:
            self._drain_acks()
            if self.engine.has_unfinished():
                self._step()
            self._maybe_commit()
        for rid, entry in list(self.inflight.items()):
            entry.handed_back = True
            self.engine.abort(rid)
        while self.engine.has_unfinished():
            self._step()
        self.producer.flush(timeout=10)
        self._drain_acks()
        self._commit()
        log.info("worker %s stopped; %s", self.name, self.metrics.summary())

    # -- polling ----------------------------------------------------------------------------
    def _poll_requests(self) -> None:
        room = self.max_inflight - len(self.inflight)
        self._apply_pause(room)
        # never wait while the engine has work; wait a little for acks; idle: wait longer
        wait_ms = 0 if self.engine.has_unfinished() else 5 if self._unacked else 50
        records = self.consumer.poll(timeout_ms=wait_ms, max_records=max(room, 1))
        self._handle_revoked()
        interactive = False
        now = time.time()
        for tp, recs in records.items():
            interactive |= tp.topic == self.settings.topic_requests
            for rec in recs:
                self._receive(tp, rec, now)
        self._interactive_busy = interactive

    def _apply_pause(self, room: int) -> None:
        """Pause everything at the limit; pause the batch topic while interactive work
        keeps coming (batch requests only take spare capacity)."""
        assigned = self.consumer.assignment()
        if room <= 0:
            want = set(assigned)
        elif self._interactive_busy:
            want = {tp for tp in assigned if tp.topic != self.settings.topic_requests}
        else:
            want = set()
        paused = self.consumer.paused()
        if want - paused:
            self.consumer.pause(*(want - paused))
        if paused - want:
            self.consumer.resume(*(paused - want))
        self.metrics.set("paused_partitions", len(want))

    def _receive(self, tp: TopicPartition, rec: Any, now: float) -> None:
        self.metrics.inc("received")
        self.tracker.add(tp, rec.offset)
        s = self.settings
        try:
            req = decode_request(rec.value, max_bytes=s.kafka_max_message_bytes,
                                 max_prompt_chars=s.max_prompt_chars)
        except SchemaError as exc:
            self._reject(tp, rec.offset, rec.value, rec.headers, exc.request_id, exc.code, exc.message,
                         exc.field, None)
            return
        rid = req.request_id
        entry = self.inflight.get(rid)
        if entry is not None or rid in self.recent:
            # Same id again: one engine run. An in-flight twin settles this offset too.
            self.metrics.inc("duplicates")
            if entry is not None:
                entry.sources.append((tp, rec.offset))
            else:
                self.tracker.done(tp, rec.offset)
            return
        if rid in self.cancelled:
            self._publish_final(FinalEvent(request_id=rid, text="", finish_reason="abort",
                                           timings=Timings(submitted_at=req.submitted_at,
                                                           queued_at=now, finished_at=now),
                                           worker=self.name, batch_id=req.batch_id),
                                [(tp, rec.offset)], rid)
            self.metrics.inc("cancelled")
            return
        try:
            messages = ([m.model_dump(mode="json", exclude_none=True) for m in req.messages]
                        if req.messages is not None else None)
            self.engine.add_request(rid, prompt=req.prompt, prompt_token_ids=req.prompt_token_ids,
                                    params=engine_params(req), priority=req.priority,
                                    messages=messages, arrival_time=now)
        except InflightError as exc:
            self._reject(tp, rec.offset, rec.value, rec.headers, rid, ERR_INVALID_REQUEST,
                         str(exc), None, req.batch_id)
            return
        self.inflight[rid] = InFlight(req, [(tp, rec.offset)], now, raw=rec.value,
                                      headers=list(rec.headers or []))
        self.metrics.inc("admitted")
        self.engine_metrics.observe_queue_time(now - req.submitted_at)
        self.max_seen_inflight = max(self.max_seen_inflight, len(self.inflight))

    # -- cancel -----------------------------------------------------------------------------
    def _cancel(self, rid: str) -> None:
        self.cancelled.add(rid)
        if rid in self.inflight and self.engine.abort(rid):
            log.info("cancelled %s", rid)

    # -- engine step ------------------------------------------------------------------------
    def _step(self) -> None:
        outputs = self.engine.step()
        self.engine_metrics.observe_outputs(outputs, time.time())
        for out in outputs:
            entry = self.inflight.get(out.request_id)
            if entry is None:
                continue
            if entry.handed_back:
                if out.finished:
                    del self.inflight[out.request_id]
                continue
            if out.new_token_ids or out.text_delta:
                entry.raw = None  # accepted by the engine: the DLQ copy is not needed
                self._send(self.settings.topic_results, out.request_id,
                           encode(TokenEvent(request_id=out.request_id, index=entry.next_index,
                                             token_ids=list(out.new_token_ids),
                                             text=out.text_delta)))
                entry.next_index += 1
                self.metrics.inc("tokens_out", len(out.new_token_ids))
            if out.finished:
                self._finish(entry, out)

    def _finish(self, entry: InFlight, out: Any) -> None:
        req = entry.request
        rid = req.request_id
        del self.inflight[rid]
        if out.finish_reason == "error":
            message = out.error or "the engine failed this request"
            # the engine says whose fault it was; input problems are DLQ-worthy, its own not
            code = getattr(out, "error_code", None) or ERR_ENGINE
            raw = entry.raw if code != ERR_ENGINE else None
            self._reject_sources(entry.sources, raw, entry.headers, rid, code, message, None,
                                 req.batch_id)
            return
        timings = Timings(submitted_at=req.submitted_at, queued_at=entry.queued_at,
                          first_token_at=out.first_token_time, finished_at=out.finish_time)
        usage = Usage(prompt_tokens=out.num_prompt_tokens, completion_tokens=len(out.token_ids),
                      cached_prompt_tokens=min(out.num_cached_tokens, out.num_prompt_tokens))
        event = FinalEvent(request_id=rid, text=out.text, token_ids=list(out.token_ids),
                           finish_reason=out.finish_reason, usage=usage, timings=timings,
                           worker=self.name, batch_id=req.batch_id)
        self.metrics.inc("cancelled" if out.finish_reason == "abort" else "completed")
        self._publish_final(event, entry.sources, rid)

    # -- publishing -------------------------------------------------------------------------
    def _send(self, topic: str, key: str | None, value: bytes, headers: list | None = None):
        return self.producer.send(topic, key=key.encode() if key else None, value=value,
                                  headers=headers or None)

    def _reject(self, tp: TopicPartition, offset: int, raw: bytes | None, headers: Any,
                rid: str | None, code: str, message: str, fld: str | None,
                batch_id: str | None) -> None:
        self._reject_sources([(tp, offset)], raw if raw is not None else b"", list(headers or []),
                             rid, code, message, fld, batch_id)

    def _reject_sources(self, sources: list, raw: bytes | None, headers: list, rid: str | None,
                        code: str, message: str, fld: str | None, batch_id: str | None) -> None:
        """Final ErrorEvent on the results topic (+ the raw message to the DLQ)."""
        event = ErrorEvent(request_id=rid, code=code, message=message, field=fld,
                           worker=self.name, batch_id=batch_id)
        msgs = [(self.settings.topic_results, rid, encode(event), [])]
        if raw is not None:
            tp, offset = sources[0]
            dlq_headers = list(headers) + [
                ("inflight-error-code", code.encode()), ("inflight-error", message.encode()[:4000]),
                ("inflight-source", f"{tp.topic}/{tp.partition}/{offset}".encode())]
            msgs.append((self.settings.topic_dlq, rid, raw, dlq_headers))
            self.metrics.inc("dlq")
        self.metrics.inc("failed")
        log.info("rejected %s (%s): %s", rid or "<no id>", code, message)
        self._track(sources, msgs, rid)

    def _publish_final(self, event: FinalEvent, sources: list, rid: str) -> None:
        self._track(sources, [(self.settings.topic_results, rid, encode(event), [])], rid)

    def _track(self, sources: list, msgs: list, rid: str | None) -> None:
        self._ack_ids += 1
        ack_id = self._ack_ids
        self._unacked[ack_id] = _Unacked(sources, msgs, len(msgs), rid)
        if rid is not None:
            self.recent.add(rid)
        for i in range(len(msgs)):
            self._send_tracked(ack_id, i)

    def _send_tracked(self, ack_id: int, i: int) -> None:
        topic, key, value, headers = self._unacked[ack_id].messages[i]
        acks = self._acks
        try:
            fut = self._send(topic, key, value, headers)
        except KafkaError as exc:  # metadata or buffer timeouts: retried like a failed ack
            acks.put((ack_id, i, exc))
            return
        # NOTE: callbacks run on the producer's I/O thread; they only enqueue.
        fut.add_callback(lambda _md: acks.put((ack_id, i, None)))
        fut.add_errback(lambda exc: acks.put((ack_id, i, exc)))

    def _drain_acks(self) -> None:
        while True:
            try:
                ack_id, i, exc = self._acks.get_nowait()
            except queue.Empty:
                return
            pending = self._unacked.get(ack_id)
            if pending is None:
                continue
            if exc is not None:
                log.warning("publishing a final event failed (%s); sending it again", exc)
                time.sleep(0.1)
                self._send_tracked(ack_id, i)
                continue
            pending.remaining -= 1
            if pending.remaining == 0:
                del self._unacked[ack_id]
                for tp, offset in pending.sources:
                    self.tracker.done(tp, offset)

    # -- commits ----------------------------------------------------------------------------
    def _maybe_commit(self) -> None:
        if time.monotonic() - self._last_commit >= COMMIT_EVERY_S:
            self._commit()

    def _commit(self) -> None:
        self._last_commit = time.monotonic()
        self._handle_revoked()
        assigned = self.consumer.assignment()
        offsets = {tp: off for tp, off in self.tracker.to_commit().items() if tp in assigned}
        if not offsets:
            return
        try:
            self.consumer.commit({tp: OffsetAndMetadata(off, "", -1) for tp, off in offsets.items()})
        except (CommitFailedError, KafkaError) as exc:
            log.warning("commit failed (%s); the watermark is committed again later", exc)
            return
        self.tracker.mark_committed(offsets)
        self.metrics.inc("commits")

    def _update_gauges(self) -> None:
        self.metrics.set("in_flight", len(self.inflight))
        self.metrics.set("commit_lag", self.tracker.lag)
        now = time.monotonic()
        if now - self._last_stats >= ENGINE_STATS_EVERY_S and hasattr(self.engine, "stats"):
            self._last_stats = now
            self.engine_metrics.observe_stats(self.engine.stats())

    # -- rebalance --------------------------------------------------------------------------
    def _handle_revoked(self) -> None:
        """Partitions taken away in a rebalance: their offsets are not ours to commit any
        more. Their in-flight requests keep running (their finals are still published;
        the new owner may redo them, which the store absorbs), and a re-delivered copy
        joins the running entry."""
        while True:
            try:
                revoked = self._revoked.get_nowait()
            except queue.Empty:
                return
            self.tracker.forget(revoked)


class _Rebalance(ConsumerRebalanceListener):
    """NOTE: kafka-python 3 calls this on its I/O thread, where blocking consumer calls
    (commit) are not allowed: it only hands the revoked set to the worker's loop."""

    def __init__(self, worker: Worker):
        self.worker = worker

    def on_partitions_revoked(self, revoked) -> None:
        self.worker._revoked.put(set(revoked))

    def on_partitions_assigned(self, assigned) -> None:
        log.info("worker %s assigned %s", self.worker.name,
                 sorted(f"{tp.topic}/{tp.partition}" for tp in assigned))


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m consumers.worker", description="run one worker")
    p.add_argument("--model", default=None)
    p.add_argument("--kv-cache-mb", type=int, default=None)
    p.add_argument("--device", default=None)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("kafka").setLevel(logging.WARNING)
    settings = Settings()
    engine = build_engine(settings, args.model, kv_cache_mb=args.kv_cache_mb, device=args.device)
    worker = Worker(settings, engine)
    worker.install_signal_handlers()
    worker.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
