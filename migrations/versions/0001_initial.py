"""initial: requests and batches

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STATUSES = "('queued', 'running', 'completed', 'failed', 'cancelled', 'expired')"


def _json() -> sa.types.TypeEngine:
    return sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")


def upgrade() -> None:
    tz = sa.DateTime(timezone=True)
    op.create_table(
        "requests",
        sa.Column("id", sa.String(128), primary_key=True),
        sa.Column("batch_id", sa.String(128), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=True),
        sa.Column("prompt", _json(), nullable=True),
        sa.Column("params", _json(), nullable=True),
        sa.Column("output", sa.Text(), nullable=True),
        sa.Column("output_token_ids", _json(), nullable=True),
        sa.Column("finish_reason", sa.String(16), nullable=True),
        sa.Column("usage", _json(), nullable=True),
        sa.Column("timings", _json(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("error_code", sa.String(64), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("worker", sa.String(256), nullable=True),
        sa.Column("created_at", tz, nullable=False),
        sa.Column("updated_at", tz, nullable=False),
        sa.Column("started_at", tz, nullable=True),
        sa.Column("finished_at", tz, nullable=True),
        sa.CheckConstraint(f"status IN {STATUSES}", name="ck_requests_status"),
    )
    op.create_index("ix_requests_batch_id", "requests", ["batch_id"])
    op.create_index("ix_requests_status", "requests", ["status"])

    op.create_table(
        "batches",
        sa.Column("id", sa.String(128), primary_key=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("total", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("completed", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("failed", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("cancelled", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("input", sa.Text(), nullable=True),
        sa.Column("output", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("metadata", _json(), nullable=True),
        sa.Column("created_at", tz, nullable=False),
        sa.Column("updated_at", tz, nullable=False),
        sa.Column("finished_at", tz, nullable=True),
        sa.Column("expires_at", tz, nullable=True),
        sa.CheckConstraint(f"status IN {STATUSES}", name="ck_batches_status"),
    )
    op.create_index("ix_batches_status", "batches", ["status"])


def downgrade() -> None:
    op.drop_index("ix_batches_status", table_name="batches")
    op.drop_table("batches")
    op.drop_index("ix_requests_status", table_name="requests")
    op.drop_index("ix_requests_batch_id", table_name="requests")
    op.drop_table("requests")
