"""Overnight batch jobs: the business logic, as plain functions (Celery only calls them).

Python API (the CLI, `producers.Client` and the HTTP API use exactly these):

    from producers import batch_jobs as jobs
    f = store.create_file(chunks, purpose="batch", filename="in.jsonl", owner=...)
    b = jobs.create_batch(store, input_file_id=f.id, endpoint="/v1/chat/completions",
                          completion_window="24h", metadata={...}, owner=...)  # `validating`
    send_enqueue(celery, b.id)        # producers.celery_app: the Celery worker then runs
    jobs.validate_and_enqueue(ctx, b.id)      # ...this: check every line, then publish
    jobs.cancel_batch(store, publisher, b.id) # `cancelling` + a cancel per open request
    jobs.sweep(ctx)                           # periodic: counts, finalize, expire, cancel end
    jobs.batch_object(row) / jobs.anthropic_batch_object(row)   # the API's JSON shapes

`ctx` is a JobContext (store, publisher, settings, context length, model name); a
publisher is anything with `publish_encoded(items, topic=)` and `cancel_many(ids)`
(producers.Client is one).

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
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from operator import itemgetter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from schemas import PRIORITY_BATCH, SchemaError, Settings, encode
from schemas.errors import NotFoundError, Retry, StateError
from store import (BATCH_FINAL_STATUSES, CANCELLED, CANCELLING, COMPLETED, EXPIRED, FAILED,
                   FINALIZING, IN_PROGRESS, QUEUED, RUNNING, VALIDATING, BatchRow, Store)
from store.models import utcnow

from producers.batch_lines import ENDPOINTS, LineChecker, LineError
from producers.batch_output import LostLease, write_results

log = logging.getLogger("inflight.batch")

WINDOW_RE = re.compile(r"^(\d+)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_RECORDED_ERRORS = 1000   # line errors kept in the batch row (the count is exact)
PROGRESS_EVERY = 5000        # validated lines between progress updates
MAX_BATCH_ID = 100           # leaves room for ':<custom_id>' in request ids
ERR_BATCH_EXPIRED = "batch_expired"


class Publisher(Protocol):
    def publish_encoded(self, items: Iterable[tuple[str, bytes]], *, topic: str) -> int: ...
    def cancel_many(self, request_ids: Iterable[str]) -> int: ...


@dataclass
class JobContext:
    """What the batch functions need; one per process (the Celery worker builds it)."""

    store: Store
    publisher: Publisher
    settings: Settings
    context_length: int | None = None   # producers.batch_lines.context_length
    model_name: str = "default"         # `model` in result bodies when a line names none
    worker: str = field(default_factory=lambda: f"pid{uuid.uuid4().hex[:6]}")


def parse_window(window: str) -> timedelta:
    """'24h' → 24 hours. OpenAI accepts only "24h"; we accept any N s|m|h|d (N >= 1)."""
    m = WINDOW_RE.match(window or "")
    if not m or int(m.group(1)) < 1:
        raise SchemaError(f"completion_window {window!r}: use a number and a unit, e.g. 24h, "
                          "90m, 2d", field="completion_window")
    return timedelta(seconds=int(m.group(1)) * _UNIT_S[m.group(2)])


def new_batch_id() -> str:
    return "batch_" + uuid.uuid4().hex


def create_batch(store: Store, *, input_file_id: str, endpoint: str,
                 completion_window: str = "24h", metadata: dict[str, Any] | None = None,
                 owner: str | None = None, batch_id: str | None = None) -> BatchRow:
    """A `validating` batch over an uploaded file (the caller then sends the enqueue task)."""
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
            for k, v in metadata.items())):
        raise SchemaError("metadata: at most 16 string keys (<= 64 chars) with string values "
                          "(<= 512 chars)", field="metadata")
    bid = batch_id or new_batch_id()
    if len(bid) > MAX_BATCH_ID:
        raise SchemaError(f"batch id is {len(bid)} characters; at most {MAX_BATCH_ID}",
                          field="batch_id")
    row = store.create_batch(bid, endpoint=endpoint, input_file_id=input_file_id,
                             completion_window=completion_window,
                             expires_at=utcnow() + window, metadata=metadata, owner=owner)
    log.info("batch %s created: file %s (%d lines), endpoint %s, window %s", bid,
             input_file_id, f.line_count, endpoint, completion_window)
    return row


# --- validate and enqueue ------------------------------------------------------------------

def validate_and_enqueue(ctx: JobContext, batch_id: str) -> str:
    """Check every line of the batch's input; a bad line fails the batch (nothing is
    published), else publish every request (resuming after `lines_enqueued`). Returns what
    happened ("failed", "enqueued", "stopped", "nothing to do"). Raises Retry when another
    task holds the batch."""
    store = ctx.store
    b = store.get_batch(batch_id)
    if b is None:
        raise NotFoundError(f"batch {batch_id!r} not found")
    if b.status not in (VALIDATING, IN_PROGRESS) or (
            b.status == IN_PROGRESS and b.lines_enqueued >= b.request_total):
        return "nothing to do"
    owner = f"enqueue:{ctx.worker}:{uuid.uuid4().hex[:8]}"
    if not store.claim_batch(batch_id, owner, ctx.settings.batch_lease_s,
                             or_owner=_dispatch_marker(batch_id)):
        raise Retry(f"batch {batch_id} is being worked on by another task", delay=5.0)
    try:
        if b.status == VALIDATING:
            outcome = _validate(ctx, b, owner)
            if outcome != IN_PROGRESS:
                return outcome
            b = store.require_batch(batch_id)
        return _enqueue(ctx, b, owner)
    finally:
        store.release_batch(batch_id, owner)


def _expired(b: BatchRow) -> bool:
    return b.expires_at is not None and utcnow() >= b.expires_at


def _checker(ctx: JobContext, b: BatchRow) -> LineChecker:
    s = ctx.settings
    return LineChecker(b.id, b.endpoint or "", context=ctx.context_length,
                       max_prompt_chars=s.max_prompt_chars,
                       max_line_bytes=s.kafka_max_message_bytes)


def _validate(ctx: JobContext, b: BatchRow, owner: str) -> str:
    store, s = ctx.store, ctx.settings
    checker = _checker(ctx, b)
    errors: list[dict[str, Any]] = []
    n_bad = n_ok = n_lines = 0
    t0 = time.monotonic()
    for no, raw in store.iter_file_lines(b.input_file_id):  # type: ignore[arg-type]
        n_lines = no
        if raw.strip():
            try:
                _, req = checker.check(no, raw)
                size = len(encode(req))
                if size > s.kafka_max_message_bytes:
                    raise SchemaError(f"line {no}: the request is {size} bytes encoded, over "
                                      f"the limit of {s.kafka_max_message_bytes} "
                                      "(INFLIGHT_KAFKA_MAX_MESSAGE_BYTES); shorten it",
                                      code="message_too_large")
                n_ok += 1
            except SchemaError as e:
                n_bad += 1
                if len(errors) < MAX_RECORDED_ERRORS:
                    errors.append(LineError(no, e.message, e.code, e.field).to_json())
        if no % PROGRESS_EVERY == 0:
            if not store.set_batch_fields(b.id, only_if_status=[VALIDATING], lines_validated=no):
                return "stopped"  # cancelled meanwhile
            if _expired(b) or not store.claim_batch(b.id, owner, s.batch_lease_s):
                return "stopped"
    if n_bad > len(errors):
        errors.append({"code": "too_many_errors", "message": f"{n_bad} bad lines in all; the "
                       f"first {len(errors)} are listed", "param": None, "line": None})
    if not n_ok and not n_bad:
        errors.append({"code": "empty_file", "message": "the input file has no requests; "
                       "give one JSON line per request", "param": None, "line": None})
    if errors:
        store.transition_batch(b.id, FAILED, lease_owner=owner, errors=errors,
                               lines_validated=n_lines)
        log.info("batch %s failed validation: %d bad of %d lines (%.1fs)", b.id, n_bad,
                 n_lines, time.monotonic() - t0)
        return FAILED
    if not store.transition_batch(b.id, IN_PROGRESS, lease_owner=owner, request_total=n_ok,
                                  lines_validated=n_lines):
        return "stopped"
    log.info("batch %s validated: %d requests in %.1fs", b.id, n_ok, time.monotonic() - t0)
    return IN_PROGRESS


def _chunks(ctx: JobContext, b: BatchRow) -> Iterator[list[tuple[str, str, bytes]]]:
    """The batch's requests not published yet, as chunks of (request_id, custom_id,
    encoded request), in input order."""
    checker = _checker(ctx, b)
    skip = b.lines_enqueued  # requests published by an earlier run of this task
    chunk: list[tuple[str, str, bytes]] = []
    for no, raw in ctx.store.iter_file_lines(b.input_file_id):  # type: ignore[arg-type]
        if not raw.strip():
            continue
        if skip:
            skip -= 1
            continue
        cid, req = checker.check(no, raw)  # validated already: cannot fail on the same bytes
        chunk.append((req.request_id, cid,
                      encode(req.model_copy(update={"submitted_at": time.time()}))))
        if len(chunk) >= ctx.settings.batch_enqueue_chunk:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _enqueue(ctx: JobContext, b: BatchRow, owner: str) -> str:
    """Publish the batch's requests, a chunk at a time, three stages overlapped:

        main thread:   parse chunk k+1 ─┐          check status ─► publish chunk k+1 ...
        db thread:                      └► insert rows k+1 ─┘
        send thread:   publish chunk k (send + wait for the broker's acks) ─► progress k

    NOTE (the order that matters, per chunk): its rows are inserted, THEN the status and
    lease are checked, THEN it is published, THEN `lines_enqueued` moves past it. So a
    published request always has a row that cancel_batch (which lists rows after moving
    the batch to `cancelling`) finds, and a retried task republishes at most the chunks
    whose acknowledgement it had not recorded."""
    store, s = ctx.store, ctx.settings
    done = b.lines_enqueued
    t0 = time.monotonic()
    rid_of = itemgetter(0)

    def insert(chunk: list[tuple[str, str, bytes]]) -> None:
        now = utcnow()
        store.insert_requests([{"id": rid, "batch_id": b.id, "custom_id": cid,
                                "owner": b.owner, "status": QUEUED, "priority": PRIORITY_BATCH,
                                "created_at": now} for rid, cid, _ in chunk])

    def publish(chunk: list[tuple[str, str, bytes]]) -> int:
        ctx.publisher.publish_encoded(((rid, value) for rid, _, value in chunk),
                                      topic=s.topic_requests_batch)
        return len(chunk)

    def settle(sent: Future[int]) -> bool:
        nonlocal done
        done += sent.result()  # BrokerError propagates: the task is retried
        return store.set_batch_fields(b.id, only_if_status=[IN_PROGRESS], lines_enqueued=done)

    def abandon(chunk: list[tuple[str, str, bytes]]) -> str:
        """Rows in, never published: if the batch is being cancelled they end `cancelled`
        now (an expired batch's open rows are ended by the sweep)."""
        cur = store.get_batch(b.id)
        if cur is not None and cur.status in (CANCELLING, CANCELLED):
            _end_requests(store, list(map(rid_of, chunk)), b.id, CANCELLED)
        return "stopped"

    def may_publish() -> bool:
        cur = store.get_batch(b.id)
        return (cur is not None and cur.status == IN_PROGRESS and not _expired(cur)
                and store.claim_batch(b.id, owner, s.batch_lease_s))

    with ThreadPoolExecutor(max_workers=2, thread_name_prefix=f"enqueue-{b.id[-6:]}") as pool:
        sending: Future[int] | None = None
        for chunk in _chunks(ctx, b):
            inserting = pool.submit(insert, chunk)
            if sending is not None and not settle(sending):
                inserting.result()
                return abandon(chunk)
            sending = None
            inserting.result()
            if not may_publish():
                return abandon(chunk)
            sending = pool.submit(publish, chunk)
        if sending is not None and not settle(sending):
            return "stopped"
    log.info("batch %s: %d requests published to %s in %.1fs", b.id, done - b.lines_enqueued,
             s.topic_requests_batch, time.monotonic() - t0)
    return "enqueued"


# --- ending requests, cancel -----------------------------------------------------------------

_END_MESSAGES = {CANCELLED: ("cancelled", "the batch was cancelled before this request ran"),
                 EXPIRED: (ERR_BATCH_EXPIRED, "the batch's completion window ended before "
                           "this request finished")}


def _end_requests(store: Store, ids: list[str], batch_id: str, status: str) -> None:
    """Give requests a final `cancelled`/`expired` row (forward-only: a request that already
    ended keeps its row)."""
    code, message = _END_MESSAGES[status]
    now = utcnow()
    store.upsert_requests({"id": rid, "batch_id": batch_id, "status": status,
                           "finish_reason": "abort", "error": message, "error_code": code,
                           "finished_at": now} for rid in ids)


def _open_request_ids(store: Store, batch_id: str) -> Iterable[list[str]]:
    """Pages of the batch's request ids that are not final yet."""
    after = None
    while True:
        rows = store.list_batch(batch_id, status=[QUEUED, RUNNING], after=after, limit=1000)
        if not rows:
            return
        yield [r.id for r in rows]
        after = rows[-1].id


def cancel_batch(store: Store, publisher: Publisher, batch_id: str) -> BatchRow:
    """`cancelling`, then a cancel on the cancel topic for every request not final yet.
    The sweep moves the batch to `cancelled` (with the partial results) once they have all
    ended. Cancelling a batch already cancelling or cancelled returns it unchanged; one that
    ended otherwise raises StateError."""
    b = store.require_batch(batch_id)
    if b.status in (CANCELLING, CANCELLED):
        return b
    if not store.transition_batch(batch_id, CANCELLING):
        b = store.require_batch(batch_id)
        if b.status in (CANCELLING, CANCELLED):
            return b
        raise StateError(f"batch {batch_id} is {b.status}; only a validating or in_progress "
                         "batch can be cancelled")
    sent = 0
    for ids in _open_request_ids(store, batch_id):
        sent += publisher.cancel_many(ids)
    log.info("batch %s cancelling: %d cancels sent", batch_id, sent)
    return store.require_batch(batch_id)


# --- the sweep -----------------------------------------------------------------------------

@dataclass
class SweepReport:
    checked: int = 0
    completed: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    redispatched: list[str] = field(default_factory=list)
    busy: list[str] = field(default_factory=list)   # another sweeper held the lease

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}


def sweep(ctx: JobContext, *, dispatch_enqueue: Callable[[str], None] | None = None,
          batch_ids: Iterable[str] | None = None) -> SweepReport:
    """One pass over every open batch (or `batch_ids`): refresh counts; finalize batches
    whose requests are all final; expire those past their window; end cancels; send the
    enqueue task again for batches whose enqueue died (no lease, no progress for a lease
    period). Idempotent; safe to run in several processes at once."""
    report = SweepReport()
    ids = (list(batch_ids) if batch_ids is not None else
           ctx.store.batch_ids([VALIDATING, IN_PROGRESS, FINALIZING, CANCELLING]))
    for bid in ids:
        report.checked += 1
        try:
            _sweep_one(ctx, bid, report, dispatch_enqueue)
        except LostLease:
            report.busy.append(bid)
    return report


def _sweep_one(ctx: JobContext, bid: str, report: SweepReport,
               dispatch_enqueue: Callable[[str], None] | None) -> None:
    store, s = ctx.store, ctx.settings
    b = store.get_batch(bid)
    if b is None or b.is_final:
        return
    if b.status != VALIDATING:
        b = store.refresh_batch_counts(bid)
    now = utcnow()
    if b.status in (VALIDATING, IN_PROGRESS) and _expired(b):
        _with_lease(ctx, b, report, lambda owner: _expire(ctx, bid, owner, report))
    elif b.status == FINALIZING or (b.status == IN_PROGRESS and b.request_total
                                   and b.lines_enqueued >= b.request_total
                                   and b.request_done >= b.request_total):
        _with_lease(ctx, b, report, lambda owner: _finalize(ctx, bid, owner, report))
    elif b.status == CANCELLING:
        grace_over = (b.cancelling_at is not None
                      and now >= b.cancelling_at + timedelta(seconds=s.batch_cancel_grace_s))
        _with_lease(ctx, b, report, lambda owner: _end_cancel(ctx, bid, owner, report, grace_over))
    elif (dispatch_enqueue is not None and b.status in (VALIDATING, IN_PROGRESS)
          and (b.status == VALIDATING or b.lines_enqueued < b.request_total)
          and (b.lease_until is None or b.lease_until < now)
          and now - (b.in_progress_at or b.created_at) > timedelta(seconds=s.batch_lease_s)):
        # NOTE: an enqueuer renews its lease every chunk, so a lapsed lease on a batch not
        # fully published means its task died (a kill -9, a lost message). The dispatch
        # marker lease keeps later sweeps from sending it again before the new task runs;
        # that task may take the marker over (claim_batch(or_owner=...)).
        if ctx.store.claim_batch(bid, _dispatch_marker(bid), s.batch_lease_s):
            log.warning("batch %s: its enqueue task is gone (%d of %d published); sending "
                        "it again", bid, b.lines_enqueued, b.request_total)
            dispatch_enqueue(bid)
            report.redispatched.append(bid)


def _dispatch_marker(batch_id: str) -> str:
    return f"dispatch:{batch_id}"


def _with_lease(ctx: JobContext, b: BatchRow, report: SweepReport,
                work: Callable[[str], None]) -> None:
    owner = f"sweep:{ctx.worker}:{uuid.uuid4().hex[:8]}"
    if not ctx.store.claim_batch(b.id, owner, ctx.settings.batch_lease_s):
        report.busy.append(b.id)
        return
    try:
        work(owner)
    finally:
        ctx.store.release_batch(b.id, owner)


def _keeper(ctx: JobContext, bid: str, owner: str) -> Callable[[], bool]:
    """A check that renews the lease, at most every quarter lease (not every page)."""
    every = ctx.settings.batch_lease_s / 4
    last = [time.monotonic()]

    def keep() -> bool:
        if time.monotonic() - last[0] < every:
            return True
        last[0] = time.monotonic()
        return ctx.store.claim_batch(bid, owner, ctx.settings.batch_lease_s)
    return keep


def _write(ctx: JobContext, b: BatchRow, owner: str, final_status: str) -> dict[str, Any]:
    """Write the result files unless the input was never fully validated (then there are
    no results: nothing was published)."""
    if b.in_progress_at is None:
        return {}
    res = write_results(ctx.store, b, default_model=ctx.model_name, final_status=final_status,
                        keep_lease=_keeper(ctx, b.id, owner))
    return {"output_file_id": res.output_file_id, "error_file_id": res.error_file_id}


def _move_or_discard(ctx: JobContext, bid: str, to: str, owner: str,
                     files: dict[str, Any]) -> bool:
    if ctx.store.transition_batch(bid, to, lease_owner=owner, **files):
        return True
    for fid in files.values():  # someone else ended the batch: our files are not used
        if fid:
            ctx.store.delete_file(fid)
    return False


def _finalize(ctx: JobContext, bid: str, owner: str, report: SweepReport) -> None:
    store = ctx.store
    b = store.require_batch(bid)
    if b.status == IN_PROGRESS:
        if not store.transition_batch(bid, FINALIZING, lease_owner=owner):
            return
        b = store.require_batch(bid)
    if b.status != FINALIZING:
        return
    t0 = time.monotonic()
    files = _write(ctx, b, owner, COMPLETED)
    if _move_or_discard(ctx, bid, COMPLETED, owner, files):
        report.completed.append(bid)
        log.info("batch %s completed: %d completed, %d failed of %d (files written in %.1fs)",
                 bid, b.request_completed, b.request_failed, b.request_total,
                 time.monotonic() - t0)


def _expire(ctx: JobContext, bid: str, owner: str, report: SweepReport) -> None:
    store = ctx.store
    b = store.require_batch(bid)
    if b.status not in (VALIDATING, IN_PROGRESS):
        return
    n = 0
    for ids in _open_request_ids(store, bid):
        _end_requests(store, ids, bid, EXPIRED)
        ctx.publisher.cancel_many(ids)
        n += len(ids)
    b = store.refresh_batch_counts(bid)
    files = _write(ctx, b, owner, EXPIRED)
    if _move_or_discard(ctx, bid, EXPIRED, owner, files):
        report.expired.append(bid)
        log.info("batch %s expired: %d requests unfinished, %d completed kept", bid, n,
                 b.request_completed)


def _end_cancel(ctx: JobContext, bid: str, owner: str, report: SweepReport,
                grace_over: bool) -> None:
    store = ctx.store
    b = store.refresh_batch_counts(bid)
    if b.status != CANCELLING:
        return
    if grace_over:
        for ids in _open_request_ids(store, bid):
            _end_requests(store, ids, bid, CANCELLED)
        b = store.refresh_batch_counts(bid)
    elif next(iter(_open_request_ids(store, bid)), None):
        return  # requests still running; their cancels are on the way
    files = _write(ctx, b, owner, CANCELLED)
    if _move_or_discard(ctx, bid, CANCELLED, owner, files):
        report.cancelled.append(bid)
        log.info("batch %s cancelled: %d completed before the cancel", bid, b.request_completed)


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
