"""SQLAlchemy 2.0 tables: `requests` (one row per request_id) and `batches`.

Request states, in the only order a row may move:

    queued ──► running ──► completed | failed | cancelled | expired   (final: never change)

JSON columns are `JSON` everywhere and `JSONB` on Postgres. Timestamps are timezone-aware
UTC datetimes on both backends.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import JSON, CheckConstraint, DateTime, Integer, String, Text, TypeDecorator
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

QUEUED, RUNNING = "queued", "running"
COMPLETED, FAILED, CANCELLED, EXPIRED = "completed", "failed", "cancelled", "expired"
STATUSES: tuple[str, ...] = (QUEUED, RUNNING, COMPLETED, FAILED, CANCELLED, EXPIRED)
FINAL_STATUSES = frozenset({COMPLETED, FAILED, CANCELLED, EXPIRED})
# NOTE: a row moves only to a strictly higher rank (same rank allowed below final).
STATUS_RANK = {QUEUED: 0, RUNNING: 1, COMPLETED: 2, FAILED: 2, CANCELLED: 2, EXPIRED: 2}

ID_LEN = 128
# none_as_null: Python None is SQL NULL (so COALESCE in upserts keeps earlier values).
JSONType = JSON(none_as_null=True).with_variant(JSONB(none_as_null=True), "postgresql")


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class UTCDateTime(TypeDecorator[datetime]):
    """Aware datetimes in, aware UTC datetimes out (SQLite drops the zone; we put it back)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: pass an aware one (timezone.utc)")
        return value.astimezone(timezone.utc)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


def _status_check(name: str) -> CheckConstraint:
    values = ", ".join(f"'{s}'" for s in STATUSES)
    return CheckConstraint(f"status IN ({values})", name=name)


class Base(DeclarativeBase):
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSONType, Any: JSONType}


class RequestRow(Base):
    __tablename__ = "requests"
    __table_args__ = (_status_check("ck_requests_status"),)

    id: Mapped[str] = mapped_column(String(ID_LEN), primary_key=True)  # = request_id
    batch_id: Mapped[str | None] = mapped_column(String(ID_LEN), index=True)
    status: Mapped[str] = mapped_column(String(16), index=True)
    priority: Mapped[int | None] = mapped_column(Integer)
    prompt: Mapped[Any | None] = mapped_column(JSONType)  # str | chat messages | {"prompt_token_ids"}
    params: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    output: Mapped[str | None] = mapped_column(Text)
    output_token_ids: Mapped[Any | None] = mapped_column(JSONType)
    finish_reason: Mapped[str | None] = mapped_column(String(16))
    usage: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    timings: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    error: Mapped[str | None] = mapped_column(Text)
    error_code: Mapped[str | None] = mapped_column(String(64))
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    worker: Mapped[str | None] = mapped_column(String(256))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]

    @property
    def is_final(self) -> bool:
        return self.status in FINAL_STATUSES

    def __repr__(self) -> str:
        return f"RequestRow(id={self.id!r}, status={self.status!r}, batch_id={self.batch_id!r})"


class BatchRow(Base):
    __tablename__ = "batches"
    __table_args__ = (_status_check("ck_batches_status"),)

    id: Mapped[str] = mapped_column(String(ID_LEN), primary_key=True)
    status: Mapped[str] = mapped_column(String(16), index=True)
    total: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    completed: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    failed: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    cancelled: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    input: Mapped[str | None] = mapped_column(Text)    # path of the JSONL input file
    output: Mapped[str | None] = mapped_column(Text)   # path of the JSONL output file
    error: Mapped[str | None] = mapped_column(Text)
    # `metadata` is reserved on declarative classes: the attribute is `meta`.
    meta: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSONType)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]
    expires_at: Mapped[datetime | None]

    @property
    def counts(self) -> dict[str, int]:
        return {"total": self.total, "completed": self.completed, "failed": self.failed,
                "cancelled": self.cancelled}

    @property
    def is_final(self) -> bool:
        return self.status in FINAL_STATUSES

    def __repr__(self) -> str:
        return f"BatchRow(id={self.id!r}, status={self.status!r}, counts={self.counts})"
