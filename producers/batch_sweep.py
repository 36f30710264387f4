"""The periodic sweep (the Celery sweep task runs `sweep`): idempotent, and safe in any
number of processes at once -- every batch's slow work runs under its lease, and every
status change is a conditional UPDATE (store.batch_queries)."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from inflight.schemas.anthropic_batch import MESSAGES_URL
from inflight.store import (CANCELLED, CANCELLING, COMPLETED, EXPIRED, FINALIZING, IN_PROGRESS,
                   VALIDATING, BatchRow)
from inflight.store.models import utcnow

from inflight.producers.batch_context import (JobContext, dispatch_marker, end_requests, expired,
                                     open_request_ids)
from inflight.producers.batch_faults import fail_batch, reason_of, transient
from inflight.producers.batch_output import LostLease, write_results, write_unrun_messages

log = logging.getLogger("inflight.batch")


@dataclass
class SweepReport:
    checked: int = 0
    completed: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    redispatched: list[str] = field(default_factory=list)
    busy: list[str] = field(default_factory=list)   # another sweeper held the lease
    deferred: list[str] = field(default_factory=list)  # database or broker away: next pass
    failed: list[str] = field(default_factory=list)    # raised: marked failed (batch_faults)
    files_expired: list[str] = field(default_factory=list)  # past expires_at: deleted

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}


def sweep(ctx: JobContext, *, dispatch_enqueue: Callable[[str], None] | None = None,
          batch_ids: Iterable[str] | None = None) -> SweepReport:
    """One pass over every open batch (or `batch_ids`): refresh counts; finalize batches
    whose requests are all final; expire those past their window; end cancels; send the
    enqueue task again for batches whose enqueue died (no lease, no progress for a lease
    period). Idempotent; safe to run in several processes at once. A batch that raises is
    marked failed with the reason (producers.batch_faults) and the pass goes on."""
    report = SweepReport()
    ids = (list(batch_ids) if batch_ids is not None else
           ctx.store.batch_ids([VALIDATING, IN_PROGRESS, FINALIZING, CANCELLING]))
    try:
        report.files_expired = ctx.store.delete_expired_files()
    except Exception as exc:  # noqa: BLE001 - the batches' sweep goes on without it
        log.warning("sweep: deleting expired files failed (%s); the next pass retries",
                    reason_of(exc))
    for bid in ids:
        report.checked += 1
        try:
            _sweep_one(ctx, bid, report, dispatch_enqueue)
        except LostLease:
            report.busy.append(bid)
        except Exception as exc:  # noqa: BLE001 — one batch never stops the sweep of the others
            if transient(exc):
                log.warning("batch %s: %s; the next sweep retries it", bid, reason_of(exc))
                report.deferred.append(bid)
            elif fail_batch(ctx, bid, exc, "sweep"):
                report.failed.append(bid)
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
    if b.status in (VALIDATING, IN_PROGRESS) and expired(b):
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
        if ctx.store.claim_batch(bid, dispatch_marker(bid), s.batch_lease_s):
            log.warning("batch %s: its enqueue task is gone (%d of %d published); sending "
                        "it again", bid, b.lines_enqueued, b.request_total)
            dispatch_enqueue(bid)
            report.redispatched.append(bid)


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


def _write(ctx: JobContext, b: BatchRow, owner: str,
           final_status: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Write the result files: (file id columns, request count columns) for the final
    transition. The counts are what the files hold, set in the same UPDATE that ends the
    batch, so no count computed earlier (a sweeper's refresh racing this one) can be what
    an ended batch shows. Nothing is written when the input was never fully validated
    (then nothing was published: no results, counts stay as they are) -- but a Message
    Batch gets a results file saying each request was canceled or expired (Anthropic's
    clients read an ended batch's results; its lines were checked at create)."""
    if b.in_progress_at is None:
        if b.endpoint != MESSAGES_URL or final_status == COMPLETED:
            return {}, {}
        fid, n = write_unrun_messages(ctx.store, b, final_status)
        return {"output_file_id": fid}, {"request_total": n, f"request_{final_status}": n}
    res = write_results(ctx.store, b, default_model=ctx.model_name, final_status=final_status,
                        keep_lease=_keeper(ctx, b.id, owner))
    return ({"output_file_id": res.output_file_id, "error_file_id": res.error_file_id},
            {f"request_{status}": n for status, n in res.counts.items()})


def _move_or_discard(ctx: JobContext, bid: str, to: str, owner: str,
                     written: tuple[dict[str, Any], dict[str, Any]]) -> bool:
    files, counts = written
    if ctx.store.transition_batch(bid, to, lease_owner=owner, **files, **counts):
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
    written = _write(ctx, b, owner, COMPLETED)
    if _move_or_discard(ctx, bid, COMPLETED, owner, written):
        report.completed.append(bid)
        counts = written[1]
        log.info("batch %s completed: %d completed, %d failed of %d (files written in %.1fs)",
                 bid, counts.get("request_completed", 0), counts.get("request_failed", 0),
                 b.request_total,
                 time.monotonic() - t0)


def _expire(ctx: JobContext, bid: str, owner: str, report: SweepReport) -> None:
    store = ctx.store
    b = store.require_batch(bid)
    if b.status not in (VALIDATING, IN_PROGRESS):
        return
    n = 0
    for ids in open_request_ids(store, bid):
        end_requests(store, ids, bid, EXPIRED)
        n += len(ids)
    ctx.publisher.cancel_batch_requests(bid)  # the workers drop what is left of it
    b = store.refresh_batch_counts(bid)
    written = _write(ctx, b, owner, EXPIRED)
    if _move_or_discard(ctx, bid, EXPIRED, owner, written):
        report.expired.append(bid)
        log.info("batch %s expired: %d requests unfinished, %d completed kept", bid, n,
                 written[1].get("request_completed", 0))


def _end_cancel(ctx: JobContext, bid: str, owner: str, report: SweepReport,
                grace_over: bool) -> None:
    store = ctx.store
    b = store.refresh_batch_counts(bid)
    if b.status != CANCELLING:
        return
    if grace_over:
        for ids in open_request_ids(store, bid):
            end_requests(store, ids, bid, CANCELLED)
        b = store.refresh_batch_counts(bid)
    elif next(iter(open_request_ids(store, bid)), None):
        return  # requests still running; their cancels are on the way
    written = _write(ctx, b, owner, CANCELLED)
    if _move_or_discard(ctx, bid, CANCELLED, owner, written):
        report.cancelled.append(bid)
        log.info("batch %s cancelled: %d completed before the cancel", bid,
                 written[1].get("request_completed", 0))
