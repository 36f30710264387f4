"""The `api_keys` table (Alembic 0003) and its queries.

A key is stored as its id, a name, the owner its rows are filed under, and an argon2 hash
of its secret (api/keys.py makes and checks them); the secret itself is never stored.
A revoked key keeps its row (revoked_at set) so `inflight keys list` can still show it.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import String, select, update
from sqlalchemy.orm import Mapped, mapped_column

from inflight.store.models import OWNER_LEN, Base, utcnow
from inflight.store.queries import Store

KEY_ID_LEN = 32


class ApiKeyRow(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(KEY_ID_LEN), primary_key=True)   # "key_<12 hex>"
    name: Mapped[str] = mapped_column(String(128))
    owner: Mapped[str] = mapped_column(String(OWNER_LEN), index=True)
    secret_hash: Mapped[str] = mapped_column(String(256))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None]

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None

    def __repr__(self) -> str:
        return f"ApiKeyRow(id={self.id!r}, name={self.name!r}, owner={self.owner!r})"


def insert_key(store: Store, *, key_id: str, name: str, owner: str, secret_hash: str) -> ApiKeyRow:
    row = ApiKeyRow(id=key_id, name=name, owner=owner, secret_hash=secret_hash,
                    created_at=utcnow())
    with store.session() as s:
        s.add(row)
    return row


def get_key(store: Store, key_id: str) -> ApiKeyRow | None:
    with store.session() as s:
        return s.get(ApiKeyRow, key_id)


def key_revoked(store: Store, key_id: str) -> bool:
    """True when the key is revoked or gone (the cheap re-check of a cached key)."""
    with store.engine.connect() as conn:
        row = conn.execute(select(ApiKeyRow.revoked_at).where(ApiKeyRow.id == key_id)).first()
    return row is None or row[0] is not None


def list_keys(store: Store, *, include_revoked: bool = True) -> list[ApiKeyRow]:
    q = select(ApiKeyRow).order_by(ApiKeyRow.created_at, ApiKeyRow.id)
    if not include_revoked:
        q = q.where(ApiKeyRow.revoked_at.is_(None))
    with store.session() as s:
        return list(s.scalars(q).all())


def revoke_key(store: Store, key_id: str) -> ApiKeyRow | None:
    """Mark a key revoked (idempotent: the first revocation time stays). None if unknown."""
    with store.session() as s:
        s.execute(update(ApiKeyRow).where(ApiKeyRow.id == key_id, ApiKeyRow.revoked_at.is_(None))
                  .values(revoked_at=utcnow()))
    return get_key(store, key_id)
