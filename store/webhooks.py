"""Queries of the webhook tables (store.webhook_models): endpoints, the batch-events outbox,
deliveries and attempts. Functions of a Store, like store.keys.

NOTE (claims): a delivery is sent by whoever moves its `next_attempt_at` forward first
(one conditional UPDATE, `claim_delivery`), so any number of jobs workers may run the
delivery task at once and each attempt is made by one of them.
"""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import or_, select, update

from inflight.schemas.errors import NotFoundError
from inflight.store.models import utcnow
from inflight.store.queries import Store
from inflight.store.webhook_models import (DELIVERED, DISABLED, ENABLED, GAVE_UP, PENDING,
                                           BatchEventRow, WebhookAttemptRow,
                                           WebhookDeliveryRow, WebhookEndpointRow,
                                           add_batch_event, new_event_id)  # noqa: F401

BATCH_EVENT_TYPES = ("batch.completed", "batch.failed", "batch.expired", "batch.cancelled")


# -- endpoints ----------------------------------------------------------------------------------

def create_endpoint(store: Store, *, url: str, events: list[str], secret: str,
                    owner: str | None) -> WebhookEndpointRow:
    row = WebhookEndpointRow(id=f"we_{secrets.token_hex(12)}", owner=owner, url=url,
                             events=list(events), secret=secret, status=ENABLED, failures=0,
                             created_at=utcnow())
    with store.session() as s:
        s.add(row)
    return row


def list_endpoints(store: Store, owner: str | None = None, *,
                   every_owner: bool = False) -> list[WebhookEndpointRow]:
    q = select(WebhookEndpointRow).order_by(WebhookEndpointRow.created_at,
                                            WebhookEndpointRow.id)
    if not every_owner:
        q = q.where(_owner_is(WebhookEndpointRow.owner, owner))
    with store.session() as s:
        return list(s.scalars(q).all())


def get_endpoint(store: Store, endpoint_id: str) -> WebhookEndpointRow | None:
    with store.session() as s:
        return s.get(WebhookEndpointRow, endpoint_id)


def require_endpoint(store: Store, endpoint_id: str) -> WebhookEndpointRow:
    row = get_endpoint(store, endpoint_id)
    if row is None:
        raise NotFoundError(f"webhook endpoint {endpoint_id!r} not found; `inflight webhooks "
                            "list` shows the registered ones")
    return row


def delete_endpoint(store: Store, endpoint_id: str) -> bool:
    """Remove the endpoint; its pending deliveries are dropped (attempts are kept)."""
    with store.session() as s:
        row = s.get(WebhookEndpointRow, endpoint_id)
        if row is None:
            return False
        s.execute(update(WebhookDeliveryRow).where(
            WebhookDeliveryRow.endpoint_id == endpoint_id, WebhookDeliveryRow.status == PENDING)
            .values(status=GAVE_UP, finished_at=utcnow()))
        s.delete(row)
    return True


def list_attempts(store: Store, endpoint_id: str, *, limit: int = 100) -> list[WebhookAttemptRow]:
    """Newest first."""
    with store.session() as s:
        return list(s.scalars(select(WebhookAttemptRow)
                              .where(WebhookAttemptRow.endpoint_id == endpoint_id)
                              .order_by(WebhookAttemptRow.id.desc()).limit(limit)).all())


def _owner_is(column: Any, owner: str | None) -> Any:
    return column.is_(None) if owner is None else column == owner


# -- the outbox ---------------------------------------------------------------------------------

def batch_events(store: Store, batch_id: str) -> list[BatchEventRow]:
    with store.session() as s:
        return list(s.scalars(select(BatchEventRow).where(BatchEventRow.batch_id == batch_id)
                              .order_by(BatchEventRow.created_at)).all())


def unfanned_events(store: Store, limit: int = 500) -> list[BatchEventRow]:
    with store.session() as s:
        return list(s.scalars(select(BatchEventRow).where(BatchEventRow.fanned_out.is_(False))
                              .order_by(BatchEventRow.created_at).limit(limit)).all())


def claim_event(store: Store, event: BatchEventRow, hold_s: float) -> bool:
    """Take the event for `hold_s` seconds unless another task holds it: True = this caller
    publishes and fans it out (a caller that dies loses the claim when it runs out)."""
    now = utcnow()
    with store.session() as s:
        res = s.execute(update(BatchEventRow).where(
            BatchEventRow.id == event.id, BatchEventRow.fanned_out.is_(False),
            or_(BatchEventRow.claimed_until.is_(None), BatchEventRow.claimed_until < now))
            .values(claimed_until=now + timedelta(seconds=hold_s)))
        return res.rowcount == 1


def release_event(store: Store, event: BatchEventRow) -> None:
    """Give the claim back (its publish failed): the next pass takes it again."""
    with store.session() as s:
        s.execute(update(BatchEventRow).where(BatchEventRow.id == event.id)
                  .values(claimed_until=None))


def fan_out(store: Store, event: BatchEventRow, published: bool) -> int:
    """Write one pending delivery per enabled endpoint of the event's owner that wants its
    type, and mark the event fanned out (`published`: it is on the topic too). Returns the
    number of deliveries."""
    now = utcnow()
    with store.session() as s:
        eps = s.scalars(select(WebhookEndpointRow).where(
            _owner_is(WebhookEndpointRow.owner, event.owner),
            WebhookEndpointRow.status == ENABLED)).all()
        n = 0
        for ep in eps:
            if event.type in (ep.events or ()):
                s.execute(store._insert(WebhookDeliveryRow.__table__).values(
                    event_id=event.id, endpoint_id=ep.id, status=PENDING, attempts=0,
                    next_attempt_at=now, created_at=now).on_conflict_do_nothing())
                n += 1
        values: dict[str, Any] = {"fanned_out": True}
        if published:
            values["published_at"] = now
        s.execute(update(BatchEventRow).where(BatchEventRow.id == event.id).values(**values))
    return n


# -- deliveries ---------------------------------------------------------------------------------

def due_deliveries(store: Store, limit: int = 100) -> list[WebhookDeliveryRow]:
    with store.session() as s:
        return list(s.scalars(select(WebhookDeliveryRow).where(
            WebhookDeliveryRow.status == PENDING, WebhookDeliveryRow.next_attempt_at <= utcnow())
            .order_by(WebhookDeliveryRow.next_attempt_at).limit(limit)).all())


def claim_delivery(store: Store, d: WebhookDeliveryRow, hold_s: float) -> bool:
    """Move the delivery's next attempt `hold_s` ahead if nobody else has: True = this
    caller makes the attempt now."""
    with store.session() as s:
        res = s.execute(update(WebhookDeliveryRow).where(
            WebhookDeliveryRow.id == d.id, WebhookDeliveryRow.status == PENDING,
            WebhookDeliveryRow.next_attempt_at == d.next_attempt_at)
            .values(next_attempt_at=utcnow() + timedelta(seconds=hold_s)))
        return res.rowcount == 1


def get_event(store: Store, event_id: str) -> BatchEventRow | None:
    with store.session() as s:
        return s.get(BatchEventRow, event_id)


def record_attempt(store: Store, d: WebhookDeliveryRow, *, ok: bool, status_code: int | None,
                   latency_ms: int, error: str | None, retry_in_s: float | None,
                   disable_after: int) -> str | None:
    """Write the attempt and its outcome: delivered; or retried in `retry_in_s`; or (None)
    given up. An endpoint with `disable_after` failed attempts in a row is disabled, with
    the reason returned (and its pending deliveries given up)."""
    now = utcnow()
    attempt = d.attempts + 1
    with store.session() as s:
        s.add(WebhookAttemptRow(delivery_id=d.id, endpoint_id=d.endpoint_id, event_id=d.event_id,
                                attempt=attempt, attempted_at=now, ok=ok,
                                status_code=status_code, latency_ms=latency_ms, error=error))
        if ok:
            s.execute(update(WebhookDeliveryRow).where(WebhookDeliveryRow.id == d.id).values(
                status=DELIVERED, attempts=attempt, finished_at=now))
            s.execute(update(WebhookEndpointRow).where(WebhookEndpointRow.id == d.endpoint_id)
                      .values(failures=0))
            return None
        if retry_in_s is None:
            s.execute(update(WebhookDeliveryRow).where(WebhookDeliveryRow.id == d.id).values(
                status=GAVE_UP, attempts=attempt, finished_at=now))
        else:
            s.execute(update(WebhookDeliveryRow).where(WebhookDeliveryRow.id == d.id).values(
                attempts=attempt, next_attempt_at=now + timedelta(seconds=retry_in_s)))
        ep = s.get(WebhookEndpointRow, d.endpoint_id)
        if ep is None or ep.status != ENABLED:
            return None
        ep.failures += 1
        if ep.failures < disable_after:
            return None
        what = f"HTTP {status_code}" if status_code is not None else (error or "no answer")
        reason = (f"disabled after {ep.failures} failed delivery attempts in a row (the last: "
                  f"{what} at {now.isoformat(timespec='seconds')}); fix the receiver, then "
                  "register it again")
        ep.status, ep.disabled_reason, ep.disabled_at = DISABLED, reason, now
        s.execute(update(WebhookDeliveryRow).where(
            WebhookDeliveryRow.endpoint_id == d.endpoint_id,
            WebhookDeliveryRow.status == PENDING).values(status=GAVE_UP, finished_at=now))
        return reason


def give_up(store: Store, d: WebhookDeliveryRow) -> None:
    """A delivery whose endpoint was disabled or removed meanwhile."""
    with store.session() as s:
        s.execute(update(WebhookDeliveryRow).where(
            WebhookDeliveryRow.id == d.id, WebhookDeliveryRow.status == PENDING)
            .values(status=GAVE_UP, finished_at=utcnow()))
