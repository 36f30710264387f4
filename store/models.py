"""SQLAlchemy 2.0 tables: `requests` (one row per request_id), `batches` (OpenAI Batch
objects), `files` + `file_chunks` (uploaded and generated JSONL files).

Request states, in the only order a row may move:

    queued ──► running ──► completed | failed | cancelled | expired   (final: never change)

Batch states (OpenAI's), in the only directions a row may move (BATCH_PREDECESSORS):

    validating ──► in_progress ──► finalizing ──► completed
        │  │            │  └─────────────────────► expired
        │  └────────────┴──► cancelling ─────────► cancelled
        └──► failed            (validating ──► expired | cancelling too)
    failed also from in_progress, finalizing and cancelling: a batch whose own processing
    broke (producers.batch_faults) ends there with the reason, and the sweep goes on.

JSON columns are `JSON` everywhere and `JSONB` on Postgres. Timestamps are timezone-aware
UTC datetimes on both backends.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (JSON, BigInteger, CheckConstraint, DateTime, ForeignKey, Index, Integer,
                        LargeBinary, String, Text, TypeDecorator)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

QUEUED, RUNNING = "queued", "running"
COMPLETED, FAILED, CANCELLED, EXPIRED = "completed", "failed", "cancelled", "expired"
STATUSES: tuple[str, ...] = (QUEUED, RUNNING, COMPLETED, FAILED, CANCELLED, EXPIRED)
FINAL_STATUSES = frozenset({COMPLETED, FAILED, CANCELLED, EXPIRED})
# NOTE: a row moves only to a strictly higher rank (same rank allowed below final).
STATUS_RANK = {QUEUED: 0, RUNNING: 1, COMPLETED: 2, FAILED: 2, CANCELLED: 2, EXPIRED: 2}

# Batch (OpenAI Batch object) states.
VALIDATING, IN_PROGRESS, FINALIZING, CANCELLING = "validating", "in_progress", "finalizing", "cancelling"
BATCH_STATUSES: tuple[str, ...] = (VALIDATING, FAILED, IN_PROGRESS, FINALIZING, COMPLETED, EXPIRED,
                                   CANCELLING, CANCELLED)
BATCH_FINAL_STATUSES = frozenset({FAILED, COMPLETED, EXPIRED, CANCELLED})
# NOTE: the only moves a batch row makes: status -> the statuses it may come from. Every
# change is one conditional UPDATE ... WHERE status IN (predecessors) (store.batch_queries),
# so two processes racing on one batch cannot both move it, and nothing moves backwards.
BATCH_PREDECESSORS: dict[str, frozenset[str]] = {
    IN_PROGRESS: frozenset({VALIDATING}),
    FAILED: frozenset({VALIDATING, IN_PROGRESS, FINALIZING, CANCELLING}),
    FINALIZING: frozenset({IN_PROGRESS}),
    COMPLETED: frozenset({FINALIZING}),
    EXPIRED: frozenset({VALIDATING, IN_PROGRESS}),
    CANCELLING: frozenset({VALIDATING, IN_PROGRESS}),
    CANCELLED: frozenset({CANCELLING}),
}

# File states: chunks are written (each chunk its own transaction) while `uploading`;
# the row turns `uploaded` with its size, line count and sha256 once the last one is in.
FILE_UPLOADING, FILE_UPLOADED = "uploading", "uploaded"
FILE_STATUSES: tuple[str, ...] = (FILE_UPLOADING, FILE_UPLOADED)

ID_LEN = 128
MODEL_LEN = 128  # schemas.base.MAX_MODEL_ID_LEN
OWNER_LEN = 256
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


_ESC = "\uffff"  # a noncharacter: text holds it only by accident


class ExactText(TypeDecorator[str]):
    """Text stored exactly, NUL characters included (a model can emit them, and Postgres
    text cannot hold them): NUL is written as U+FFFF "0", U+FFFF itself as U+FFFF "1", and
    read back as they were. Text with neither is stored as it is."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Any) -> str | None:
        if value is None or ("\x00" not in value and _ESC not in value):
            return value
        return value.replace(_ESC, _ESC + "1").replace("\x00", _ESC + "0")

    def process_result_value(self, value: str | None, dialect: Any) -> str | None:
        if value is None or _ESC not in value:
            return value
        return re.sub(_ESC + "([01])", lambda m: _ESC if m[1] == "1" else "\x00", value)


def _status_check(name: str, statuses: tuple[str, ...] = STATUSES) -> CheckConstraint:
    values = ", ".join(f"'{s}'" for s in statuses)
    return CheckConstraint(f"status IN ({values})", name=name)


class Base(DeclarativeBase):
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSONType, Any: JSONType}


class RequestRow(Base):
    __tablename__ = "requests"
    # ix_requests_batch_updated: a running batch's finished lines in the order they were
    # written (partial results, producers.batch_partial); ix_requests_owner_created_at: the
    # limits' window (api/rate_limits.py), an owner's recent requests
    __table_args__ = (_status_check("ck_requests_status"),
                      Index("ix_requests_batch_updated", "batch_id", "updated_at", "id"),
                      Index("ix_requests_owner_created_at", "owner", "created_at"))

    id: Mapped[str] = mapped_column(String(ID_LEN), primary_key=True)  # = request_id
    batch_id: Mapped[str | None] = mapped_column(String(ID_LEN), index=True)
    custom_id: Mapped[str | None] = mapped_column(String(512))  # the batch line's custom_id
    owner: Mapped[str | None] = mapped_column(String(OWNER_LEN), index=True)  # set by the HTTP API
    # the model the request named (resolved by the router), then the one that ran it (the
    # final event's: the worker's served model id)
    model: Mapped[str | None] = mapped_column(String(MODEL_LEN), index=True)
    # who it is for (InferenceRequest.tenant: the key's owner on the HTTP API)
    tenant: Mapped[str | None] = mapped_column(String(OWNER_LEN), index=True)
    # its token charge: prompt (estimated) + max_tokens when filed by the API, the real
    # prompt + completion tokens once final (tokens-per-minute limits read it)
    tokens: Mapped[int | None] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(16), index=True)
    priority: Mapped[int | None] = mapped_column(Integer)
    prompt: Mapped[Any | None] = mapped_column(JSONType)  # str | chat messages | {"prompt_token_ids"}
    params: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    output: Mapped[str | None] = mapped_column(ExactText)  # the final text, NULs too
    output_token_ids: Mapped[Any | None] = mapped_column(JSONType)
    finish_reason: Mapped[str | None] = mapped_column(String(16))
    usage: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    timings: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    logprobs: Mapped[Any | None] = mapped_column(JSONType)
    tool_calls: Mapped[Any | None] = mapped_column(JSONType)  # OpenAI's message.tool_calls
    # an embedding request's vector: float32 little-endian bytes (schemas/embeddings.py)
    embedding: Mapped[bytes | None] = mapped_column(LargeBinary)
    error: Mapped[str | None] = mapped_column(Text)
    error_code: Mapped[str | None] = mapped_column(String(64))
    # admissions of the request by a worker (its status events), counted once each: a
    # status event admitted after `attempt_started_at` is a new attempt (store.queries)
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    attempt_started_at: Mapped[datetime | None]
    worker: Mapped[str | None] = mapped_column(String(256))
    # the W3C trace id of its traceparent header (32 hex digits; docs/tracing.md)
    trace_id: Mapped[str | None] = mapped_column(String(32))
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
    """An OpenAI Batch object (plus our progress and lease columns).

    request_counts = {total, completed, failed}; requests cancelled or expired are also
    counted apart (cancelled, expired) for Anthropic's request_counts. Legacy batches
    (written before migration 0002) may lack endpoint, input_file_id and completion_window.
    """

    __tablename__ = "batches"
    __table_args__ = (_status_check("ck_batches_status", BATCH_STATUSES),)

    id: Mapped[str] = mapped_column(String(ID_LEN), primary_key=True)
    status: Mapped[str] = mapped_column(String(16), index=True)
    endpoint: Mapped[str | None] = mapped_column(String(64))
    input_file_id: Mapped[str | None] = mapped_column(String(ID_LEN))
    completion_window: Mapped[str | None] = mapped_column(String(16))
    output_file_id: Mapped[str | None] = mapped_column(String(ID_LEN))
    error_file_id: Mapped[str | None] = mapped_column(String(ID_LEN))
    errors: Mapped[Any | None] = mapped_column(JSONType)  # [{code, message, param, line}]
    owner: Mapped[str | None] = mapped_column(String(OWNER_LEN), index=True)
    # `metadata` is reserved on declarative classes: the attribute is `meta`.
    meta: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSONType)
    request_total: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    request_completed: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    request_failed: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    request_cancelled: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    request_expired: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # prompt (estimated) + max_tokens of its valid lines: what counts against its owner's
    # queued-token limit while it is not final
    queued_tokens: Mapped[int | None] = mapped_column(BigInteger)
    # progress of the validate-and-enqueue task: input lines checked, lines published
    lines_validated: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    lines_enqueued: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # seconds after created_at at which its output and error files expire (None: never)
    output_expires_after: Mapped[int | None] = mapped_column(Integer)
    # a batch made from a Parquet table: {"file_id" (the table, purpose batch_source),
    # "prompt_column", "id_column"} (producers.batch_parquet)
    parquet_source: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    # a sweeper's claim on the batch (finalize / expire / cancel work): see claim_batch
    lease_owner: Mapped[str | None] = mapped_column(String(OWNER_LEN))
    lease_until: Mapped[datetime | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    in_progress_at: Mapped[datetime | None]
    expires_at: Mapped[datetime | None]
    finalizing_at: Mapped[datetime | None]
    completed_at: Mapped[datetime | None]
    failed_at: Mapped[datetime | None]
    expired_at: Mapped[datetime | None]
    cancelling_at: Mapped[datetime | None]
    cancelled_at: Mapped[datetime | None]

    @property
    def request_counts(self) -> dict[str, int]:
        return {"total": self.request_total, "completed": self.request_completed,
                "failed": self.request_failed}

    @property
    def request_done(self) -> int:
        """Requests with a final row (any final status)."""
        return (self.request_completed + self.request_failed + self.request_cancelled
                + self.request_expired)

    @property
    def is_final(self) -> bool:
        return self.status in BATCH_FINAL_STATUSES

    @property
    def ended_at(self) -> datetime | None:
        return self.completed_at or self.failed_at or self.expired_at or self.cancelled_at

    def __repr__(self) -> str:
        return f"BatchRow(id={self.id!r}, status={self.status!r}, counts={self.request_counts})"


class FileRow(Base):
    """An OpenAI File object; its bytes live in `file_chunks` (so any process that reaches
    the database reaches the content: a Celery worker, the HTTP API, the CLI)."""

    __tablename__ = "files"
    __table_args__ = (_status_check("ck_files_status", FILE_STATUSES),)

    id: Mapped[str] = mapped_column(String(ID_LEN), primary_key=True)
    purpose: Mapped[str] = mapped_column(String(32))   # batch | batch_output | batch_errors
    filename: Mapped[str] = mapped_column(String(512))
    status: Mapped[str] = mapped_column(String(16))
    bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    line_count: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    sha256: Mapped[str | None] = mapped_column(String(64))
    owner: Mapped[str | None] = mapped_column(String(OWNER_LEN), index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime | None]
    # where the content is: s3://bucket/key on object storage (INFLIGHT_FILES_URL), NULL
    # for `file_chunks` (store.object_files)
    location: Mapped[str | None] = mapped_column(Text)

    def __repr__(self) -> str:
        return f"FileRow(id={self.id!r}, filename={self.filename!r}, bytes={self.bytes})"


class FileChunkRow(Base):
    """One piece (up to store.files.CHUNK_BYTES) of a file's content, in order of `seq`."""

    __tablename__ = "file_chunks"

    file_id: Mapped[str] = mapped_column(String(ID_LEN), ForeignKey("files.id", ondelete="CASCADE"),
                                         primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)
