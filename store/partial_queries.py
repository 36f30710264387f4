"""A running batch's finished request rows in the order they were written (keyset on
`(updated_at, id)`, index ix_requests_batch_updated): the pages of partial results."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import and_, or_, select

from inflight.store.models import FINAL_STATUSES, RequestRow
from inflight.store.queries import Store


def finished_page(store: Store, batch_id: str, *, after: tuple[datetime, str] | None,
                  written_before: datetime | None, limit: int) -> list[dict[str, Any]]:
    """Up to `limit` final rows of the batch written after the cursor `after`
    ((updated_at, id) of the last row already read) and, with `written_before`, at or
    before it (rows still being committed are left to the next page); plain dicts."""
    t = RequestRow.__table__.c
    q = select(t.id, t.custom_id, t.model, t.status, t.output, t.finish_reason, t.usage,
               t.error, t.error_code, t.finished_at, t.tool_calls, t.embedding,
               t.updated_at).where(
        t.batch_id == batch_id, t.status.in_(sorted(FINAL_STATUSES)))
    if after is not None:
        at, rid = after
        q = q.where(or_(t.updated_at > at, and_(t.updated_at == at, t.id > rid)))
    if written_before is not None:
        q = q.where(t.updated_at <= written_before)
    q = q.order_by(t.updated_at, t.id).limit(limit)
    with store.session() as s:
        return [r._asdict() for r in s.execute(q)]
