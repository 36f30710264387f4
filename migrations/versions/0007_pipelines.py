"""pipelines: webhook endpoints, the batch-events outbox, deliveries and their attempts;
an index for a running batch's finished lines (partial results); batches.output_expires_after and parquet_source; files.location (object storage)

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _json() -> sa.types.TypeEngine:
    from sqlalchemy.dialects.postgresql import JSONB

    return sa.JSON(none_as_null=True).with_variant(JSONB(none_as_null=True), "postgresql")


def upgrade() -> None:
    tz = sa.DateTime(timezone=True)
    op.create_table(
        "webhook_endpoints",
        sa.Column("id", sa.String(128), primary_key=True),
        sa.Column("owner", sa.String(256), nullable=True),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("events", _json(), nullable=False),
        sa.Column("secret", sa.String(128), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("disabled_reason", sa.Text(), nullable=True),
        sa.Column("failures", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("created_at", tz, nullable=False),
        sa.Column("disabled_at", tz, nullable=True),
    )
    op.create_index("ix_webhook_endpoints_owner", "webhook_endpoints", ["owner"])
    op.create_table(
        "batch_events",
        sa.Column("id", sa.String(128), primary_key=True),
        sa.Column("type", sa.String(64), nullable=False),
        sa.Column("batch_id", sa.String(128), nullable=False),
        sa.Column("owner", sa.String(256), nullable=True),
        sa.Column("created_at", tz, nullable=False),
        sa.Column("fanned_out", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("published_at", tz, nullable=True),
        sa.Column("claimed_until", tz, nullable=True),
    )
    op.create_index("ix_batch_events_batch_id", "batch_events", ["batch_id"])
    op.create_index("ix_batch_events_fanned", "batch_events", ["fanned_out"])
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("event_id", sa.String(128), nullable=False),
        sa.Column("endpoint_id", sa.String(128), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("next_attempt_at", tz, nullable=False),
        sa.Column("created_at", tz, nullable=False),
        sa.Column("finished_at", tz, nullable=True),
        sa.UniqueConstraint("event_id", "endpoint_id", name="uq_webhook_delivery"),
    )
    op.create_index("ix_webhook_deliveries_endpoint_id", "webhook_deliveries", ["endpoint_id"])
    op.create_index("ix_webhook_deliveries_due", "webhook_deliveries",
                    ["status", "next_attempt_at"])
    op.create_table(
        "webhook_attempts",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("delivery_id", sa.Integer(), nullable=False),
        sa.Column("endpoint_id", sa.String(128), nullable=False),
        sa.Column("event_id", sa.String(128), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("attempted_at", tz, nullable=False),
        sa.Column("ok", sa.Boolean(), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("latency_ms", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
    )
    op.create_index("ix_webhook_attempts_delivery_id", "webhook_attempts", ["delivery_id"])
    op.create_index("ix_webhook_attempts_endpoint_id", "webhook_attempts", ["endpoint_id"])
    op.create_index("ix_requests_batch_updated", "requests", ["batch_id", "updated_at", "id"])
    with op.batch_alter_table("batches") as batch:
        batch.add_column(sa.Column("output_expires_after", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("parquet_source", _json(), nullable=True))
    with op.batch_alter_table("files") as batch:
        batch.add_column(sa.Column("location", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("files") as batch:
        batch.drop_column("location")
    with op.batch_alter_table("batches") as batch:
        batch.drop_column("parquet_source")
        batch.drop_column("output_expires_after")
    op.drop_index("ix_requests_batch_updated", table_name="requests")
    for table, indexes in (
            ("webhook_attempts", ["ix_webhook_attempts_endpoint_id",
                                  "ix_webhook_attempts_delivery_id"]),
            ("webhook_deliveries", ["ix_webhook_deliveries_due",
                                    "ix_webhook_deliveries_endpoint_id"]),
            ("batch_events", ["ix_batch_events_fanned", "ix_batch_events_batch_id"]),
            ("webhook_endpoints", ["ix_webhook_endpoints_owner"])):
        for ix in indexes:
            op.drop_index(ix, table_name=table)
        op.drop_table(table)
