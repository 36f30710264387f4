"""api keys: the HTTP API's bearer keys (argon2 hashes, never the keys)

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    tz = sa.DateTime(timezone=True)
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("owner", sa.String(256), nullable=False),
        sa.Column("secret_hash", sa.String(256), nullable=False),
        sa.Column("created_at", tz, nullable=False),
        sa.Column("revoked_at", tz, nullable=True),
    )
    op.create_index("ix_api_keys_owner", "api_keys", ["owner"])


def downgrade() -> None:
    op.drop_index("ix_api_keys_owner", table_name="api_keys")
    op.drop_table("api_keys")
