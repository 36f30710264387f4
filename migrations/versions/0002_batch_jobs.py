"""batch jobs: files + file_chunks, batches as OpenAI Batch objects, requests.custom_id,
owner columns (HTTP API) and requests.logprobs (quantization)

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01

Existing data is kept. `batches` is rebuilt (its status values and columns change) by
copying every row into the new shape:

    0001 status   -> 0002 status      timestamps
    queued        -> in_progress      in_progress_at = created_at
    running       -> in_progress      in_progress_at = created_at
    completed     -> completed        completed_at = finished_at (or updated_at)
    failed        -> failed           failed_at = ...
    cancelled     -> cancelled        cancelled_at = ...
    expired       -> expired          expired_at = ...

total/completed/failed/cancelled -> request_total/_completed/_failed/_cancelled; the old
`error` text becomes one entry of `errors`; the old input/output paths (no file ids
existed) are kept in metadata as `legacy_input` / `legacy_output`. The downgrade maps back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_STATUSES = ("queued", "running", "completed", "failed", "cancelled", "expired")
NEW_STATUSES = ("validating", "failed", "in_progress", "finalizing", "completed", "expired",
                "cancelling", "cancelled")
FILE_STATUSES = ("uploading", "uploaded")
ID, OWNER = 128, 256
COPY_PAGE = 500

_UP = {"queued": "in_progress", "running": "in_progress"}
_DOWN = {"validating": "queued", "in_progress": "running", "finalizing": "running",
         "cancelling": "running"}
_FINAL_AT = {"completed": "completed_at", "failed": "failed_at", "cancelled": "cancelled_at",
             "expired": "expired_at"}


def _json() -> sa.types.TypeEngine:
    return sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")


def _check(name: str, values: tuple[str, ...]) -> sa.CheckConstraint:
    return sa.CheckConstraint("status IN (" + ", ".join(f"'{v}'" for v in values) + ")", name=name)


def _tz() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def _new_batches(name: str) -> sa.Table:
    return sa.Table(
        name, sa.MetaData(),
        sa.Column("id", sa.String(ID), primary_key=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("endpoint", sa.String(64), nullable=True),
        sa.Column("input_file_id", sa.String(ID), nullable=True),
        sa.Column("completion_window", sa.String(16), nullable=True),
        sa.Column("output_file_id", sa.String(ID), nullable=True),
        sa.Column("error_file_id", sa.String(ID), nullable=True),
        sa.Column("errors", _json(), nullable=True),
        sa.Column("owner", sa.String(OWNER), nullable=True),
        sa.Column("metadata", _json(), nullable=True),
        *[sa.Column(f"request_{k}", sa.Integer(), nullable=False, server_default="0")
          for k in ("total", "completed", "failed", "cancelled", "expired")],
        sa.Column("lines_validated", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("lines_enqueued", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("lease_owner", sa.String(OWNER), nullable=True),
        sa.Column("lease_until", _tz(), nullable=True),
        sa.Column("created_at", _tz(), nullable=False),
        sa.Column("updated_at", _tz(), nullable=False),
        *[sa.Column(f"{k}_at", _tz(), nullable=True)
          for k in ("in_progress", "expires", "finalizing", "completed", "failed", "expired",
                    "cancelling", "cancelled")],
        _check("ck_batches_status", NEW_STATUSES),
    )


def _old_batches(name: str) -> sa.Table:
    return sa.Table(
        name, sa.MetaData(),
        sa.Column("id", sa.String(ID), primary_key=True),
        sa.Column("status", sa.String(16), nullable=False),
        *[sa.Column(k, sa.Integer(), nullable=False, server_default="0")
          for k in ("total", "completed", "failed", "cancelled")],
        sa.Column("input", sa.Text(), nullable=True),
        sa.Column("output", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("metadata", _json(), nullable=True),
        sa.Column("created_at", _tz(), nullable=False),
        sa.Column("updated_at", _tz(), nullable=False),
        sa.Column("finished_at", _tz(), nullable=True),
        sa.Column("expires_at", _tz(), nullable=True),
        _check("ck_batches_status", OLD_STATUSES),
    )


def _copy(src: sa.Table, dst: sa.Table, convert: Any) -> None:
    """Copy every row of src into dst through `convert`, a page at a time (by id)."""
    bind = op.get_bind()
    last = None
    while True:
        q = sa.select(src).order_by(src.c.id).limit(COPY_PAGE)
        if last is not None:
            q = q.where(src.c.id > last)
        rows = [dict(r._mapping) for r in bind.execute(q)]
        if not rows:
            return
        bind.execute(sa.insert(dst), [convert(r) for r in rows])
        last = rows[-1]["id"]


def _up_row(r: dict[str, Any]) -> dict[str, Any]:
    status = _UP.get(r["status"], r["status"])
    meta = dict(r["metadata"] or {})
    for old, key in (("input", "legacy_input"), ("output", "legacy_output")):
        if r[old]:
            meta[key] = r[old]
    out: dict[str, Any] = {
        "id": r["id"], "status": status, "endpoint": None, "input_file_id": None,
        "completion_window": None, "output_file_id": None, "error_file_id": None,
        "errors": [{"code": "legacy_error", "message": r["error"], "param": None, "line": None}]
        if r["error"] else None,
        "owner": None, "metadata": meta or None,
        "request_total": r["total"], "request_completed": r["completed"],
        "request_failed": r["failed"], "request_cancelled": r["cancelled"], "request_expired": 0,
        "lines_validated": r["total"], "lines_enqueued": r["total"],
        "lease_owner": None, "lease_until": None,
        "created_at": r["created_at"], "updated_at": r["updated_at"],
        "in_progress_at": r["created_at"], "expires_at": r["expires_at"],
    }
    for k in ("finalizing", "completed", "failed", "expired", "cancelling", "cancelled"):
        out[f"{k}_at"] = None
    if status in _FINAL_AT:
        out[_FINAL_AT[status]] = r["finished_at"] or r["updated_at"]
    return out


def _down_row(r: dict[str, Any]) -> dict[str, Any]:
    meta = dict(r["metadata"] or {})
    inp, outp = meta.pop("legacy_input", None), meta.pop("legacy_output", None)
    errors = r["errors"] or []
    return {
        "id": r["id"], "status": _DOWN.get(r["status"], r["status"]),
        "total": r["request_total"], "completed": r["request_completed"],
        "failed": r["request_failed"],
        "cancelled": r["request_cancelled"] + r["request_expired"],
        "input": inp or r["input_file_id"], "output": outp or r["output_file_id"],
        "error": "; ".join(str(e.get("message")) for e in errors) or None,
        "metadata": meta or None, "created_at": r["created_at"], "updated_at": r["updated_at"],
        "finished_at": r["completed_at"] or r["failed_at"] or r["expired_at"] or r["cancelled_at"],
        "expires_at": r["expires_at"],
    }


def _swap_batches(old_shape: Any, new_shape: Any, convert: Any, indexes: Sequence[str]) -> None:
    """batches (old shape) -> batches (new shape), every row converted.

    NOTE: the old table's indexes are dropped first: on Postgres an index name is unique
    in the schema and would clash with the new table's."""
    for name in indexes:
        op.drop_index(name, table_name="batches")
    op.rename_table("batches", "batches_before_0002")
    src = old_shape("batches_before_0002")
    dst = new_shape("batches")
    dst.create(op.get_bind())
    _copy(src, dst, convert)
    op.drop_table("batches_before_0002")
    op.create_index("ix_batches_status", "batches", ["status"])


def upgrade() -> None:
    with op.batch_alter_table("requests") as b:
        b.add_column(sa.Column("custom_id", sa.String(512), nullable=True))
        b.add_column(sa.Column("owner", sa.String(OWNER), nullable=True))
        b.add_column(sa.Column("logprobs", _json(), nullable=True))
    op.create_index("ix_requests_owner", "requests", ["owner"])

    op.create_table(
        "files",
        sa.Column("id", sa.String(ID), primary_key=True),
        sa.Column("purpose", sa.String(32), nullable=False),
        sa.Column("filename", sa.String(512), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("line_count", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("sha256", sa.String(64), nullable=True),
        sa.Column("owner", sa.String(OWNER), nullable=True),
        sa.Column("created_at", _tz(), nullable=False),
        sa.Column("expires_at", _tz(), nullable=True),
        _check("ck_files_status", FILE_STATUSES),
    )
    op.create_index("ix_files_owner", "files", ["owner"])
    op.create_table(
        "file_chunks",
        sa.Column("file_id", sa.String(ID), sa.ForeignKey("files.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("seq", sa.Integer(), primary_key=True),
        sa.Column("data", sa.LargeBinary(), nullable=False),
    )

    _swap_batches(_old_batches, _new_batches, _up_row, ["ix_batches_status"])
    op.create_index("ix_batches_owner", "batches", ["owner"])
    op.create_index("ix_batches_created_at", "batches", ["created_at"])


def downgrade() -> None:
    _swap_batches(_new_batches, _old_batches, _down_row,
                  ["ix_batches_status", "ix_batches_owner", "ix_batches_created_at"])
    op.drop_table("file_chunks")
    op.drop_index("ix_files_owner", table_name="files")
    op.drop_table("files")
    op.drop_index("ix_requests_owner", table_name="requests")
    with op.batch_alter_table("requests") as b:
        b.drop_column("logprobs")
        b.drop_column("owner")
        b.drop_column("custom_id")
