"""tenants: requests.tenant (who a request is for) and requests.tokens (its token charge:
reserved at submit, the real count once final); api_keys limits (rpm, tpm, max_concurrent,
max_queued_tokens) and admin; batches.queued_tokens (a batch's reserved tokens, for the
owner's queued-token limit)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

KEY_LIMITS = ("rpm", "tpm", "max_concurrent", "max_queued_tokens")


def upgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.add_column(sa.Column("tenant", sa.String(256), nullable=True))
        batch.add_column(sa.Column("tokens", sa.BigInteger(), nullable=True))
        batch.create_index("ix_requests_tenant", ["tenant"])
    # the limits' window: an owner's requests by creation time
    op.create_index("ix_requests_owner_created_at", "requests", ["owner", "created_at"])
    with op.batch_alter_table("api_keys") as batch:
        for name in KEY_LIMITS:
            batch.add_column(sa.Column(name, sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("admin", sa.Boolean(), nullable=False,
                                   server_default=sa.false()))
    with op.batch_alter_table("batches") as batch:
        batch.add_column(sa.Column("queued_tokens", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("batches") as batch:
        batch.drop_column("queued_tokens")
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("admin")
        for name in reversed(KEY_LIMITS):
            batch.drop_column(name)
    op.drop_index("ix_requests_owner_created_at", table_name="requests")
    with op.batch_alter_table("requests") as batch:
        batch.drop_index("ix_requests_tenant")
        batch.drop_column("tokens")
        batch.drop_column("tenant")
