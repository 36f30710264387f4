"""Batch rows: create, read, list, and move them only forward, atomically.

Every status change is ONE conditional statement:

    UPDATE batches SET status = :to, <to>_at = :now, ...
    WHERE id = :id AND status IN (<predecessors of :to>) [AND lease_owner = :me]

and reports whether it changed a row (rowcount). Two Celery workers racing on one batch
cannot both move it; a status never goes back (store.models.BATCH_PREDECESSORS).

Slow work on a batch (writing its output file, cancelling its requests) runs under a
lease: `claim_batch` sets (lease_owner, lease_until) only where no live lease is held, so
one sweeper at a time does it; a sweeper that dies loses the lease when it runs out.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, or_, select, tuple_, update

from inflight.schemas.errors import NotFoundError, StoreError
from inflight.store.webhook_models import add_batch_event
from inflight.store.models import (BATCH_FINAL_STATUSES, BATCH_PREDECESSORS, BATCH_STATUSES, VALIDATING,
                          BatchRow, utcnow)

# columns that progress/bookkeeping updates may set (status only through transition_batch)
_BATCH_FIELDS = {"endpoint", "input_file_id", "completion_window", "output_file_id",
                 "error_file_id", "errors", "meta", "request_total", "request_completed",
                 "request_failed", "request_cancelled", "request_expired", "lines_validated",
                 "lines_enqueued", "expires_at", "owner", "output_expires_after", "parquet_source",
                 "queued_tokens"}


def _columns(fields: dict[str, Any]) -> dict[str, Any]:
    unknown = set(fields) - _BATCH_FIELDS
    if unknown:
        raise ValueError(f"cannot set batch column(s) {sorted(unknown)}; allowed: "
                         f"{sorted(_BATCH_FIELDS)} (status only through transition_batch)")
    return {("metadata" if k == "meta" else k): v for k, v in fields.items()}


class BatchQueries:
    """Mixed into store.Store (which provides session(), _insert and dialect)."""

    def create_batch(self, batch_id: str, *, endpoint: str, input_file_id: str | None,
                     completion_window: str = "24h", expires_at: datetime | None = None,
                     metadata: dict[str, Any] | None = None, owner: str | None = None,
                     status: str = VALIDATING,
                     output_expires_after: int | None = None) -> BatchRow:
        """Create a batch row (status `validating`); creating an existing id again returns
        the stored row unchanged."""
        if status not in BATCH_STATUSES:
            raise ValueError(f"batch status {status!r} is not one of {BATCH_STATUSES}")
        now = utcnow()
        table = BatchRow.__table__
        stmt = self._insert(table).values(  # type: ignore[attr-defined]
            id=batch_id, status=status, endpoint=endpoint, input_file_id=input_file_id,
            completion_window=completion_window, metadata=metadata, owner=owner,
            created_at=now, updated_at=now, expires_at=expires_at,
            output_expires_after=output_expires_after,
        ).on_conflict_do_nothing(index_elements=[table.c.id])
        with self.session() as s:  # type: ignore[attr-defined]
            s.execute(stmt)
        return self.require_batch(batch_id)

    def get_batch(self, batch_id: str) -> BatchRow | None:
        with self.session() as s:  # type: ignore[attr-defined]
            return s.get(BatchRow, batch_id)

    def require_batch(self, batch_id: str) -> BatchRow:
        row = self.get_batch(batch_id)
        if row is None:
            raise NotFoundError(f"batch {batch_id!r} not found; `inflight batch list` shows "
                                "the known ones")
        return row

    def list_batches(self, *, owner: str | None = None, status: str | Iterable[str] | None = None,
                     after: str | None = None, limit: int = 20,
                     endpoint: Iterable[str] | None = None) -> list[BatchRow]:
        """Newest first; page with `after=<last id of the previous page>` (OpenAI's cursor).
        `endpoint` keeps batches of those endpoints (the HTTP API lists OpenAI and Anthropic
        batches apart)."""
        q = select(BatchRow)
        if owner is not None:
            q = q.where(BatchRow.owner == owner)
        if endpoint is not None:
            q = q.where(BatchRow.endpoint.in_(list(endpoint)))
        if status is not None:
            q = q.where(BatchRow.status.in_([status] if isinstance(status, str) else list(status)))
        with self.session() as s:  # type: ignore[attr-defined]
            if after is not None:
                cursor = s.get(BatchRow, after)
                if cursor is not None:
                    q = q.where(tuple_(BatchRow.created_at, BatchRow.id)
                                < tuple_(cursor.created_at, cursor.id))
            q = q.order_by(BatchRow.created_at.desc(), BatchRow.id.desc()).limit(limit)
            return list(s.scalars(q).all())

    def batch_ids(self, status: Iterable[str]) -> list[str]:
        """Ids of the batches in these statuses (the sweep's work list)."""
        with self.session() as s:  # type: ignore[attr-defined]
            return list(s.scalars(select(BatchRow.id).where(BatchRow.status.in_(list(status)))
                                  .order_by(BatchRow.created_at)).all())

    def set_batch_fields(self, batch_id: str, *, only_if_status: Iterable[str] | None = None,
                         **fields: Any) -> bool:
        """Set non-status columns (progress, counts, file ids). With `only_if_status`, only
        while the batch is in one of those statuses. Returns whether the row was updated."""
        cols = _columns(fields)
        cond = [BatchRow.id == batch_id]
        if only_if_status is not None:
            cond.append(BatchRow.status.in_(list(only_if_status)))
        with self.session() as s:  # type: ignore[attr-defined]
            res = s.execute(update(BatchRow.__table__).where(*cond)
                            .values(**cols, updated_at=utcnow()))
            return res.rowcount == 1

    def transition_batch(self, batch_id: str, to: str, *, lease_owner: str | None = None,
                         **fields: Any) -> bool:
        """Move a batch to `to` (setting `<to>_at` = now and `fields`) if its current status
        may precede `to`, and (with `lease_owner`) only while that owner holds its lease.
        Returns True when this call moved it, False otherwise (already moved, or a status
        it cannot move from). Never raises for a lost race."""
        if to not in BATCH_PREDECESSORS:
            raise ValueError(f"no batch moves to {to!r}; targets: {sorted(BATCH_PREDECESSORS)}")
        cols = _columns(fields)
        now = utcnow()
        cond = [BatchRow.id == batch_id, BatchRow.status.in_(sorted(BATCH_PREDECESSORS[to]))]
        if lease_owner is not None:
            cond.append(BatchRow.lease_owner == lease_owner)
        cols.update({"status": to, f"{to}_at": now, "updated_at": now})
        if to in BATCH_FINAL_STATUSES:
            cols.update(lease_owner=None, lease_until=None)
        with self.session() as s:  # type: ignore[attr-defined]
            moved = s.execute(update(BatchRow.__table__).where(*cond).values(**cols)).rowcount == 1
            if moved and to in BATCH_FINAL_STATUSES:
                # NOTE: the event is written by the UPDATE's own transaction (an outbox):
                # no ended batch lacks its event, none has two (the move happens once)
                owner = s.scalar(select(BatchRow.owner).where(BatchRow.id == batch_id))
                add_batch_event(s, type=f"batch.{to}", batch_id=batch_id, owner=owner, at=now)
            return moved

    def claim_batch(self, batch_id: str, owner: str, ttl_s: float, *,
                    or_owner: str | None = None) -> bool:
        """Take (or extend) the batch's lease for `ttl_s` seconds unless someone else holds
        a live one (`or_owner`: a holder whose live lease may be taken over). True =
        `owner` holds it now."""
        now = utcnow()
        free = [BatchRow.lease_owner.is_(None), BatchRow.lease_owner == owner,
                BatchRow.lease_until.is_(None), BatchRow.lease_until < now]
        if or_owner is not None:
            free.append(BatchRow.lease_owner == or_owner)
        cond = and_(BatchRow.id == batch_id, or_(*free))
        with self.session() as s:  # type: ignore[attr-defined]
            res = s.execute(update(BatchRow.__table__).where(cond).values(
                lease_owner=owner, lease_until=now + timedelta(seconds=ttl_s)))
            return res.rowcount == 1

    def release_batch(self, batch_id: str, owner: str) -> None:
        with self.session() as s:  # type: ignore[attr-defined]
            s.execute(update(BatchRow.__table__)
                      .where(BatchRow.id == batch_id, BatchRow.lease_owner == owner)
                      .values(lease_owner=None, lease_until=None))

    def refresh_batch_counts(self, batch_id: str) -> BatchRow:
        """Recompute request_completed/_failed/_cancelled/_expired from the batch's request
        rows (one GROUP BY on the batch_id index) while the batch is open.

        NOTE: the count and the UPDATE are two statements, and a sweeper can stall between
        them (CPU, a SQLite write lock) while another one ends the batch. So an ended
        batch's counts are never rewritten here (they are set by the UPDATE that ended it,
        from the files it wrote: producers.batch_sweep); a late write to an open batch is
        only ever low (final rows never change), which delays a finalization by one sweep
        and never brings one forward."""
        c = self.count_by_status(batch_id)  # type: ignore[attr-defined]
        with self.session() as s:  # type: ignore[attr-defined]
            res = s.execute(update(BatchRow.__table__).where(
                BatchRow.id == batch_id, BatchRow.status.not_in(sorted(BATCH_FINAL_STATUSES)))
                .values(request_completed=c["completed"], request_failed=c["failed"],
                        request_cancelled=c["cancelled"], request_expired=c["expired"],
                        updated_at=utcnow()))
            if res.rowcount != 1 and s.get(BatchRow, batch_id) is None:
                raise StoreError(f"batch {batch_id!r} does not exist; create it first")
        return self.require_batch(batch_id)
