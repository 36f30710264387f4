"""requests.model: the model a request named, then the one that ran it (the worker's
served model id, from its final event); NULL for rows written before several models

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-10
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.add_column(sa.Column("model", sa.String(128), nullable=True))
        batch.create_index("ix_requests_model", ["model"])


def downgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.drop_index("ix_requests_model")
        batch.drop_column("model")
