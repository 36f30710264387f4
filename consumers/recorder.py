"""The recorder: request and result topics in, idempotent upserts into the store.

    poll (requests, requests.batch, results; not results.tokens) ─► rows ─► Store.upsert_requests ─► commit
    (consumers/recorder_source.py: librdkafka by default, kafka-python if asked)

- request message → `queued` row (prompt, params); invalid ones are skipped here (the
  worker publishes their ErrorEvent, which lands as a `failed` row);
- StatusEvent (a worker admitted it) → `running` row (worker, start time). Token deltas
  live on their own topic, which the recorder does not read: its volume follows requests;
- FinalEvent / ErrorEvent → the final row. The store's upsert is forward-only, so a
  duplicate final event (a request redone after a worker crash) changes nothing.

NOTE: offsets are committed only after the database commit. While the database is away
the recorder keeps its batch, retries with exponential backoff (capped) and polls nothing
more; if it is stopped meanwhile it commits nothing, so the group re-reads that batch.
"""

from __future__ import annotations

import logging
import signal
import time
from typing import Any

from kafka.errors import CommitFailedError, KafkaError

from inflight.consumers.lag import LagProbe
from inflight.consumers.metrics import Metrics
from inflight.consumers.recorder_source import recorder_source
from inflight.schemas import (ErrorEvent, FinalEvent, SchemaError, Settings, StatusEvent,
                     decode_request, decode_result)
from inflight.schemas.errors import StoreError
from inflight.schemas.headers import trace_id
from inflight.transport import tracing
from inflight.store import (FINAL_STATUSES, Store, error_row, final_row, queued_row, running_row,
                            stand_in_rows)
from inflight.store.queries import is_transient
from inflight.store.rows import clean_row

log = logging.getLogger("inflight.recorder")

BACKOFF_START_S, BACKOFF_MAX_S = 0.2, 5.0
BATCH_SIZE_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
COMMIT_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class _Stopping(Exception):
    """Asked to stop while the database is away: commit nothing."""


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0][:500] if str(exc) else type(exc).__name__


class Recorder:
    def __init__(self, settings: Settings, store: Store | None = None, *,
                 metrics: Metrics | None = None):
        self.settings = settings
        self.store = store or Store.embedded(settings.database_url)
        self.metrics = metrics or Metrics("recorder", settings.metrics_interval_s)
        self.batch_size = self.metrics.histogram("batch_size", "rows per store upsert",
                                                 BATCH_SIZE_BUCKETS)
        self.commit_latency = self.metrics.histogram(
            "commit_latency_seconds", "seconds per store upsert + database commit",
            COMMIT_LATENCY_BUCKETS)
        self.lag: LagProbe | None = None
        self.consumer = None
        self._stopping = False
        self.tracer = tracing.tracer(settings, "inflight.recorder")  # None: tracing is off

    def stop(self, *_: Any) -> None:
        self._stopping = True

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)

    def open(self) -> "Recorder":
        s = self.settings
        topics = [s.topic_requests, s.topic_requests_batch, s.topic_results]
        self.consumer = recorder_source(s, s.recorder_group, topics, s.recorder_batch_size)
        metrics = ""
        if s.metrics_port is not None:
            port = self.metrics.serve(s.metrics_port + 1, s.metrics_host)
            metrics = f" metrics=http://{s.metrics_host}:{port}/metrics"
            self.lag = LagProbe(s, s.recorder_group, topics, self.metrics.registry,
                                s.metrics_lag_interval_s).start()
        log.info("recorder: %s -> %s: group=%s%s", ",".join(topics),
                 self.store.url.split("@")[-1], s.recorder_group, metrics)
        return self

    def run(self) -> None:
        if self.consumer is None:
            self.open()
        try:
            while not self._stopping:
                self.run_once()
        finally:
            self.close()

    def run_once(self, timeout_ms: int = 100) -> int:
        batch = self.consumer.poll(timeout_ms / 1000, self.settings.recorder_batch_size)
        if not batch:
            self.metrics.maybe_log()
            return 0
        rows: list[dict[str, Any]] = []
        offsets = {}
        n = 0
        traced: list[tuple[dict[str, Any], list]] = []  # tracing on: final rows, headers
        for tp, records in batch.items():
            for offset, value, headers in records:
                n += 1
                try:
                    row = self._row(tp.topic, value)
                    if row is not None and headers:
                        tid = trace_id(headers)
                        if tid is not None:
                            row["trace_id"] = tid
                            if self.tracer is not None and row["status"] in FINAL_STATUSES:
                                traced.append((row, headers))
                except Exception as exc:  # noqa: BLE001 — one record never stops the others
                    # NOTE: a message that passed validation but still cannot become a row
                    # must not crash the recorder at every restart (a poison pill)
                    self.metrics.inc("records_skipped")
                    log.error("no row from %s/%d@%d: %s: %s; skipped", tp.topic, tp.partition,
                              offset, type(exc).__name__, exc)
                    continue
                if row is not None:
                    rows.append(row)
            offsets[tp] = records[-1][0] + 1
        self.metrics.inc("received", n)
        started = time.time()
        if rows and not self._write(rows):
            return n  # stopping during an outage: commit nothing
        if traced:
            self._spans(traced, started, time.time())
        self._commit(offsets)
        self.metrics.maybe_log()
        return n

    def _row(self, topic: str, value: bytes | None) -> dict[str, Any] | None:
        s = self.settings
        if topic != s.topic_results:
            try:
                req = decode_request(value, max_bytes=s.kafka_max_message_bytes,
                                     max_prompt_chars=s.max_prompt_chars)
            except SchemaError:
                return None  # the worker publishes its ErrorEvent
            return queued_row(req)
        try:
            event = decode_result(value)
        except SchemaError as exc:
            log.warning("skipping an undecodable result event: %s", exc.message)
            return None
        if isinstance(event, StatusEvent):
            return running_row(event.request_id, worker=event.worker, started_at=event.at)
        if isinstance(event, FinalEvent):
            self.metrics.inc("cancelled" if event.finish_reason == "abort" else "completed")
            return final_row(event)
        if isinstance(event, ErrorEvent) and event.request_id is not None:
            self.metrics.inc("failed")
            return error_row(event)
        return None

    def _spans(self, traced: list[tuple[dict[str, Any], list]], start: float, end: float) -> None:
        """An `inflight.record` span per final row written, in its request's trace."""
        for row, headers in traced:
            span = self.tracer.start_span(
                "inflight.record", context=tracing.context_from(headers),
                start_time=tracing.ns(start),
                attributes={"inflight.request_id": row["id"], "inflight.status": row["status"],
                            "db.system": self.store.dialect, "db.operation.name": "upsert",
                            "inflight.batch_rows": len(traced)})
            span.end(end_time=tracing.ns(end))

    def _write(self, rows: list[dict[str, Any]]) -> bool:
        """Upsert until it works (True), or until asked to stop (False).

        An unreachable database is retried with backoff, offsets held. A batch the database
        refuses for its content is written row by row, and a row that is still refused is
        replaced by its stand-ins (store.rows.stand_in_rows: a final row becomes an error
        row saying why), so the request still ends with one final row and retrying it
        forever does not stall every request behind it."""
        rows = [clean_row(r) for r in rows]
        try:
            refused = self._upsert(rows)
            if refused is not None:
                for row in rows:
                    self._write_row(row)
        except _Stopping:
            return False
        return True

    def _write_row(self, row: dict[str, Any]) -> None:
        refused = self._upsert([row])
        if refused is None:
            return
        reason = _first_line(refused)
        self.metrics.inc("rows_refused")
        log.error("the database refused the %s row of request %s (%s); storing a stand-in",
                  row["status"], row["id"], reason)
        for stand_in in stand_in_rows(row, reason):
            if self._upsert([clean_row(stand_in)]) is None:
                return
        log.error("request %s cannot be stored at all and is skipped", row["id"])

    def _upsert(self, rows: list[dict[str, Any]]) -> StoreError | None:
        """Write `rows`: None when written, the error when the database refuses them. While
        the database is away: retry with backoff, or raise _Stopping once asked to stop."""
        delay = BACKOFF_START_S
        while True:
            try:
                started = time.perf_counter()
                self.store.upsert_requests(rows)
                self.commit_latency.observe(time.perf_counter() - started)
                self.batch_size.observe(len(rows))
                self.metrics.inc("rows_written", len(rows))
                return None
            except StoreError as exc:
                if not is_transient(exc):
                    return exc
                self.metrics.inc("db_retries")
                log.warning("database write failed (%s); retrying in %.1fs, offsets held",
                            _first_line(exc), delay)
            except Exception as exc:  # noqa: BLE001 — a value no driver can take: refused data
                return StoreError(f"{type(exc).__name__}: {exc}")
            if self._stopping:
                raise _Stopping
            time.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX_S)

    def _commit(self, offsets: dict) -> None:
        assigned = self.consumer.assignment()
        mine = {tp: off for tp, off in offsets.items() if tp in assigned}
        if not mine:
            return
        try:
            self.consumer.commit(mine)
            self.metrics.inc("commits")
        except (CommitFailedError, KafkaError) as exc:
            # A rebalance took the partitions: the new owner re-reads; upserts are idempotent.
            log.warning("recorder commit failed (%s)", exc)

    def close(self) -> None:
        if self.lag is not None:
            self.lag.close()
            self.lag = None
        if self.consumer is not None:
            try:
                self.consumer.close()
            except Exception:  # noqa: BLE001
                log.exception("closing the recorder's consumer failed")
            self.consumer = None
        self.metrics.close()
