"""Tables of batch events and their webhooks (Alembic 0007_pipelines).

    batches ──(a move to a final status, same transaction)──► batch_events  (the outbox)
    batch_events ──(the jobs worker's delivery task fans each one out)──►
        webhook_deliveries (one per matching endpoint) ──► webhook_attempts (one per POST)
        and the batch-events Kafka topic (published_at)

An event's id (`evt_...`) is stable: every attempt of every delivery of one event carries
it as `webhook-id`, so receivers de-duplicate (delivery is at-least-once).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import secrets

from sqlalchemy import Boolean, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from inflight.store.models import ID_LEN, OWNER_LEN, Base, JSONType, utcnow

# endpoint states
ENABLED, DISABLED = "enabled", "disabled"
# delivery states
PENDING, DELIVERED, GAVE_UP = "pending", "delivered", "failed"


class WebhookEndpointRow(Base):
    """A registered receiver: its URL, the event types it wants, its signing secret
    (`whsec_` + base64, Standard Webhooks), and whether it still gets events."""

    __tablename__ = "webhook_endpoints"

    id: Mapped[str] = mapped_column(String(ID_LEN), primary_key=True)   # "we_<hex>"
    owner: Mapped[str | None] = mapped_column(String(OWNER_LEN), index=True)
    url: Mapped[str] = mapped_column(Text)
    events: Mapped[Any] = mapped_column(JSONType)                       # ["batch.completed", ...]
    secret: Mapped[str] = mapped_column(String(128))
    status: Mapped[str] = mapped_column(String(16), default=ENABLED)
    disabled_reason: Mapped[str | None] = mapped_column(Text)
    failures: Mapped[int] = mapped_column(Integer, default=0, server_default="0")  # in a row
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    disabled_at: Mapped[datetime | None]


class BatchEventRow(Base):
    """One batch state change (`batch.completed|failed|expired|cancelled`), written by the
    UPDATE that made it (store.batch_queries.transition_batch)."""

    __tablename__ = "batch_events"
    __table_args__ = (Index("ix_batch_events_fanned", "fanned_out"),)

    id: Mapped[str] = mapped_column(String(ID_LEN), primary_key=True)   # "evt_<hex>"
    type: Mapped[str] = mapped_column(String(64))
    batch_id: Mapped[str] = mapped_column(String(ID_LEN), index=True)
    owner: Mapped[str | None] = mapped_column(String(OWNER_LEN))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # handed to the endpoints (deliveries written) and to the topic
    fanned_out: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")
    published_at: Mapped[datetime | None]
    # a delivery task's claim on fanning it out (so two tasks at once publish it once)
    claimed_until: Mapped[datetime | None]


class WebhookDeliveryRow(Base):
    """One event for one endpoint, tried until delivered or given up."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (UniqueConstraint("event_id", "endpoint_id", name="uq_webhook_delivery"),
                      Index("ix_webhook_deliveries_due", "status", "next_attempt_at"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    event_id: Mapped[str] = mapped_column(String(ID_LEN))
    endpoint_id: Mapped[str] = mapped_column(String(ID_LEN), index=True)
    status: Mapped[str] = mapped_column(String(16), default=PENDING)
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    next_attempt_at: Mapped[datetime] = mapped_column(default=utcnow)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]


class WebhookAttemptRow(Base):
    """One POST of a delivery: when, how long, what came back."""

    __tablename__ = "webhook_attempts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    delivery_id: Mapped[int] = mapped_column(Integer, index=True)
    endpoint_id: Mapped[str] = mapped_column(String(ID_LEN), index=True)
    event_id: Mapped[str] = mapped_column(String(ID_LEN))
    attempt: Mapped[int] = mapped_column(Integer)                 # 1, 2, ...
    attempted_at: Mapped[datetime] = mapped_column(default=utcnow)
    ok: Mapped[bool] = mapped_column(Boolean)
    status_code: Mapped[int | None] = mapped_column(Integer)      # None: no HTTP answer
    latency_ms: Mapped[int] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)


def new_event_id() -> str:
    return f"evt_{secrets.token_hex(12)}"


def add_batch_event(session: Any, *, type: str, batch_id: str, owner: str | None,
                    at: datetime) -> None:
    """Write one event in the caller's transaction (the batch UPDATE that made it)."""
    session.add(BatchEventRow(id=new_event_id(), type=type, batch_id=batch_id, owner=owner,
                              created_at=at, fanned_out=False))
