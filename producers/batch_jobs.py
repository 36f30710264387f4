"""Overnight batch jobs: the business logic, as plain functions (Celery only calls them).

Python API (the CLI, `producers.Client` and the HTTP API use exactly these):

    from inflight.producers import batch_jobs as jobs
    f = store.create_file(chunks, purpose="batch", filename="in.jsonl", owner=...)
    b = jobs.create_batch(store, input_file_id=f.id, endpoint="/v1/chat/completions",
                          completion_window="24h", metadata={...}, owner=...)  # `validating`
    send_enqueue(celery, b.id)        # producers.celery_app: the Celery worker then runs
    jobs.validate_and_enqueue(ctx, b.id)      # ...this: check every line, then publish
    jobs.cancel_batch(store, publisher, b.id) # `cancelling` + one cancel for the batch
    jobs.sweep(ctx)                           # periodic: counts, finalize, expire, cancel end
    jobs.batch_object(row) / jobs.anthropic_batch_object(row)   # the API's JSON shapes

`ctx` is a JobContext (store, publisher, settings, context length, model name); a
publisher is a RequestPublisher: anything with `publish_encoded(items, topic=)`,
`cancel_many(ids)` and `cancel_batch_requests(batch_id)` (producers.Client is one).

Lifecycle and who moves it (every move is one conditional UPDATE, store.batch_queries):

    validate_and_enqueue   validating ─► failed (line-numbered errors; nothing published)
                           validating ─► in_progress ─ publishes, lines_enqueued grows
    sweep                  in_progress ─► finalizing ─► completed   (all requests final)
                           validating | in_progress ─► expired      (window over)
                           cancelling ─► cancelled                  (all final, or grace over)
    cancel_batch           validating | in_progress ─► cancelling

NOTE (no request runs twice): request ids are derived from (batch id, custom_id); queued
rows are inserted (ON CONFLICT DO NOTHING) before their chunk is published and
`lines_enqueued` is advanced after the broker acknowledged it, so a killed task that is
run again republishes at most one chunk, whose ids the workers and the store already
know (one engine run, one final row). Enqueue and the sweep's slow work hold the batch's
lease, so two Celery workers never work on one batch at once.
"""

from __future__ import annotations

import logging
import re
import uuid
from datetime import datetime, timedelta
from typing import Any

from inflight.schemas import SchemaError
from inflight.schemas.errors import Retry, StateError
from inflight.store import BATCH_FINAL_STATUSES, CANCELLED, CANCELLING, BatchRow, Store
from inflight.store.models import utcnow

from inflight.producers.batch_context import JobContext, RequestPublisher
from inflight.producers.batch_enqueue import validate_and_enqueue
from inflight.producers.batch_lines import ENDPOINTS
from inflight.producers.batch_sweep import SweepReport, sweep

log = logging.getLogger("inflight.batch")

WINDOW_RE = re.compile(r"^(\d+)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_BATCH_ID = 100           # leaves room for ':<custom_id>' in request ids

__all__ = ["JobContext", "RequestPublisher", "Retry", "SweepReport", "create_batch", "cancel_batch",
           "validate_and_enqueue", "sweep", "batch_object", "anthropic_batch_object",
           "parse_window", "new_batch_id"]


def parse_window(window: str) -> timedelta:
    """'24h' → 24 hours. OpenAI accepts only "24h"; we accept any N s|m|h|d (N >= 1)."""
    m = WINDOW_RE.match(window or "")
    if not m or int(m.group(1)) < 1:
        raise SchemaError(f"completion_window {window!r}: use a number and a unit, e.g. 24h, "
                          "90m, 2d", field="completion_window")
    return timedelta(seconds=int(m.group(1)) * _UNIT_S[m.group(2)])


def new_batch_id() -> str:
    return "batch_" + uuid.uuid4().hex


MAX_EXPIRY_S = 30 * 86_400   # OpenAI's bound: 30 days


def expiry_seconds(value: Any, field: str) -> int | None:
    """`{"anchor": "created_at", "seconds": N}` (an SDK's expires_after) -> N, or None."""
    if value is None:
        return None
    if hasattr(value, "model_dump"):
        value = value.model_dump()
    seconds = value.get("seconds") if isinstance(value, dict) else None
    if (not isinstance(value, dict) or value.get("anchor") != "created_at"
            or isinstance(seconds, bool) or not isinstance(seconds, int)
            or not 1 <= seconds <= MAX_EXPIRY_S):
        raise SchemaError(f"{field}: give {{\"anchor\": \"created_at\", \"seconds\": N}} with "
                          f"1 <= N <= {MAX_EXPIRY_S}", field=field)
    return seconds


def create_batch(store: Store, *, input_file_id: str, endpoint: str,
                 completion_window: str = "24h", metadata: dict[str, Any] | None = None,
                 owner: str | None = None, batch_id: str | None = None,
                 output_expires_after: dict[str, Any] | None = None) -> BatchRow:
    """A `validating` batch over an uploaded file (the caller then sends the enqueue task).
    `output_expires_after`: `{"anchor": "created_at", "seconds": N}` (OpenAI's): its output
    and error files expire N seconds after the batch was created."""
    expires_s = expiry_seconds(output_expires_after, "output_expires_after")
    if endpoint not in ENDPOINTS:
        raise SchemaError(f"endpoint {endpoint!r}: use one of {', '.join(ENDPOINTS)}",
                          field="endpoint")
    window = parse_window(completion_window)
    f = store.require_file(input_file_id)
    if f.purpose != "batch":
        raise SchemaError(f"file {input_file_id} has purpose {f.purpose!r}; upload the input "
                          "with purpose 'batch'", field="input_file_id")
    if metadata is not None and (len(metadata) > 16 or not all(
            isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512
            and "\x00" not in k + v for k, v in metadata.items())):
        raise SchemaError("metadata: at most 16 string keys (<= 64 chars) with string values "
                          "(<= 512 chars), without the NUL character", field="metadata")
    bid = batch_id or new_batch_id()
    if len(bid) > MAX_BATCH_ID:
        raise SchemaError(f"batch id is {len(bid)} characters; at most {MAX_BATCH_ID}",
                          field="batch_id")
    row = store.create_batch(bid, endpoint=endpoint, input_file_id=input_file_id,
                             completion_window=completion_window,
                             expires_at=utcnow() + window, metadata=metadata, owner=owner,
                             output_expires_after=expires_s)
    log.info("batch %s created: file %s (%d lines), endpoint %s, window %s", bid,
             input_file_id, f.line_count, endpoint, completion_window)
    return row


# --- cancel ---------------------------------------------------------------------------------

def cancel_batch(store: Store, publisher: RequestPublisher, batch_id: str) -> BatchRow:
    """`cancelling`, then one batch cancel on the cancel topic: every worker keeps it for
    its cancel lookback window, ends the batch's queued requests `cancelled` when it reads
    them and aborts the running ones (one message, whatever the batch's size). The sweep
    moves the batch to `cancelled` (with the partial results) once they have all ended.
    Cancelling a batch already cancelling or cancelled returns it unchanged (and sends the
    cancel again: a retry after a failed send); one that ended otherwise raises StateError."""
    b = store.require_batch(batch_id)
    if b.status == CANCELLED:
        return b
    if b.status != CANCELLING and not store.transition_batch(batch_id, CANCELLING):
        b = store.require_batch(batch_id)
        if b.status == CANCELLED:
            return b
        if b.status != CANCELLING:
            raise StateError(f"batch {batch_id} is {b.status}; only a validating or "
                             "in_progress batch can be cancelled")
    publisher.cancel_batch_requests(batch_id)
    log.info("batch %s cancelling: batch cancel sent", batch_id)
    return store.require_batch(batch_id)


def live_counts(store: Store, b: BatchRow) -> BatchRow:
    """`b` with its request counts counted now (one GROUP BY on the batch_id index; nothing
    written) while it runs, so `request_counts` are exact at every moment; an ended batch's
    counts are the ones its final UPDATE set."""
    if b.is_final or b.in_progress_at is None:
        return b
    c = store.count_by_status(b.id)
    b.request_completed, b.request_failed = c["completed"], c["failed"]
    b.request_cancelled, b.request_expired = c["cancelled"], c["expired"]
    return b


# --- the JSON shapes ---------------------------------------------------------------------------

def _ts(at: datetime | None) -> int | None:
    return int(at.timestamp()) if at is not None else None


def batch_object(b: BatchRow) -> dict[str, Any]:
    """The OpenAI Batch object (plus `x_progress` with our validate/enqueue counters)."""
    return {
        "id": b.id, "object": "batch", "endpoint": b.endpoint,
        "errors": {"object": "list", "data": list(b.errors)} if b.errors else None,
        "input_file_id": b.input_file_id, "completion_window": b.completion_window,
        "status": b.status, "output_file_id": b.output_file_id, "error_file_id": b.error_file_id,
        "created_at": _ts(b.created_at), "in_progress_at": _ts(b.in_progress_at),
        "expires_at": _ts(b.expires_at), "finalizing_at": _ts(b.finalizing_at),
        "completed_at": _ts(b.completed_at), "failed_at": _ts(b.failed_at),
        "expired_at": _ts(b.expired_at), "cancelling_at": _ts(b.cancelling_at),
        "cancelled_at": _ts(b.cancelled_at), "request_counts": b.request_counts,
        "metadata": b.meta,
        "output_expires_after": ({"anchor": "created_at", "seconds": b.output_expires_after}
                                 if b.output_expires_after else None),
        "x_progress": {"lines_validated": b.lines_validated, "lines_enqueued": b.lines_enqueued,
                       "cancelled": b.request_cancelled, "expired": b.request_expired},
    }


def _iso(at: datetime | None) -> str | None:
    return at.isoformat().replace("+00:00", "Z") if at is not None else None


def anthropic_batch_object(b: BatchRow, results_url: str | None = None) -> dict[str, Any]:
    """The Anthropic Message Batch object."""
    processing = ("ended" if b.status in BATCH_FINAL_STATUSES else
                  "canceling" if b.status == CANCELLING else "in_progress")
    open_ = max(b.request_total - b.request_done, 0) if processing != "ended" else 0
    return {
        "id": b.id, "type": "message_batch", "processing_status": processing,
        "request_counts": {"processing": open_, "succeeded": b.request_completed,
                           "errored": b.request_failed, "canceled": b.request_cancelled,
                           "expired": b.request_expired},
        "ended_at": _iso(b.ended_at), "created_at": _iso(b.created_at),
        "expires_at": _iso(b.expires_at), "archived_at": None,
        "cancel_initiated_at": _iso(b.cancelling_at),
        "results_url": results_url if processing == "ended" and b.output_file_id else None,
    }
