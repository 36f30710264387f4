"""What limits and usage read from the store: an owner's recent requests, what it has in
flight and queued, and token usage by owner, model and day.

NOTE: limits are counted here, in the database every API process shares, from the
`requests` rows themselves (their `tokens` column: the API's reservation at submit,
replaced by the real count when the recorder writes the final row), not in per-process
counters: two API processes see the same numbers, and a finished request corrects its
reservation without any bookkeeping of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from typing import Any

from sqlalchemy import Date, and_, cast, func, select

from inflight.store.keys import ApiKeyRow
from inflight.store.models import (BATCH_FINAL_STATUSES, QUEUED, RUNNING, BatchRow, RequestRow,
                                   utcnow)
from inflight.store.queries import Store


@dataclass(frozen=True)
class OwnerWindow:
    """An owner's requests created in the window, their tokens, the oldest one's time, and
    its interactive requests still queued or running (any age)."""

    requests: int
    tokens: int
    oldest: datetime | None
    in_flight: int


def owner_window(store: Store, owner: str, window_s: float,
                 now: datetime | None = None) -> OwnerWindow:
    now = now or utcnow()
    since = now - timedelta(seconds=window_s)
    recent = and_(RequestRow.owner == owner, RequestRow.created_at > since)
    live = and_(RequestRow.owner == owner, RequestRow.status.in_((QUEUED, RUNNING)),
                RequestRow.batch_id.is_(None))
    with store.engine.connect() as conn:
        n, tokens, oldest = conn.execute(
            select(func.count(), func.coalesce(func.sum(RequestRow.tokens), 0),
                   func.min(RequestRow.created_at)).where(recent)).one()
        in_flight = conn.execute(select(func.count()).where(live)).scalar_one()
    if oldest is not None and oldest.tzinfo is None:  # SQLite hands back naive UTC
        oldest = oldest.replace(tzinfo=timezone.utc)
    return OwnerWindow(int(n), int(tokens or 0), oldest, int(in_flight))


def owner_queued_tokens(store: Store, owner: str | None, exclude: str | None = None) -> int:
    """Tokens reserved by the owner's batches that are not final (`batches.queued_tokens`)."""
    q = select(func.coalesce(func.sum(BatchRow.queued_tokens), 0)).where(
        BatchRow.owner == owner, BatchRow.status.not_in(BATCH_FINAL_STATUSES))
    if exclude is not None:
        q = q.where(BatchRow.id != exclude)
    with store.engine.connect() as conn:
        return int(conn.execute(q).scalar_one())


def owner_queued_token_limit(store: Store, owner: str | None) -> int | None:
    """The owner's queued-token limit: the smallest set on its live keys (None: none)."""
    if owner is None:
        return None
    q = select(func.min(ApiKeyRow.max_queued_tokens)).where(
        ApiKeyRow.owner == owner, ApiKeyRow.revoked_at.is_(None))
    with store.engine.connect() as conn:
        value = conn.execute(q).scalar_one()
    return None if value is None else int(value)


def usage_by_day(store: Store, *, owner: str | None = None, model: str | None = None,
                 start: date | None = None, end: date | None = None,
                 by_tenant: bool = False) -> list[dict[str, Any]]:
    """Token usage of final requests, one row per (owner, model, day): requests,
    prompt_tokens, completion_tokens (from `usage`), days by `finished_at` (UTC).
    `owner`: only that owner's (None: everyone's); `by_tenant`: group by tenant instead."""
    who = RequestRow.tenant if by_tenant else RequestRow.owner
    day = (func.date(RequestRow.finished_at) if store.dialect == "sqlite"
           else cast(func.timezone("UTC", RequestRow.finished_at), Date))
    prompt = RequestRow.usage["prompt_tokens"].as_integer()
    completion = RequestRow.usage["completion_tokens"].as_integer()
    q = (select(who, RequestRow.model, day.label("day"), func.count(),
                func.coalesce(func.sum(prompt), 0), func.coalesce(func.sum(completion), 0))
         .where(RequestRow.finished_at.is_not(None), RequestRow.usage.is_not(None))
         .group_by(who, RequestRow.model, day).order_by(day, who, RequestRow.model))
    if owner is not None:
        q = q.where(RequestRow.owner == owner)
    if model is not None:
        q = q.where(RequestRow.model == model)
    if start is not None:
        q = q.where(RequestRow.finished_at >= datetime.combine(start, datetime.min.time(), timezone.utc))
    if end is not None:
        q = q.where(RequestRow.finished_at < datetime.combine(end + timedelta(days=1),
                                                              datetime.min.time(), timezone.utc))
    with store.engine.connect() as conn:
        rows = conn.execute(q).all()
    key = "tenant" if by_tenant else "owner"
    return [{key: r[0], "model": r[1], "day": str(r[2])[:10], "requests": int(r[3]),
             "prompt_tokens": int(r[4] or 0), "completion_tokens": int(r[5] or 0),
             "total_tokens": int(r[4] or 0) + int(r[5] or 0)} for r in rows]

