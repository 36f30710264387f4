"""The `api_keys` table (Alembic 0003) and its queries.

A key is stored as its id, a name, the owner its rows are filed under, and an argon2 hash
of its secret (api/keys.py makes and checks them); the secret itself is never stored.
A revoked key keeps its row (revoked_at set) so `inflight keys list` can still show it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Boolean, String, false, select, update
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
    # limits (None = none), counted over the owner's requests (api/rate_limits.py)
    rpm: Mapped[int | None] = mapped_column(BigInteger)
    tpm: Mapped[int | None] = mapped_column(BigInteger)
    max_concurrent: Mapped[int | None] = mapped_column(BigInteger)
    max_queued_tokens: Mapped[int | None] = mapped_column(BigInteger)
    # sees every owner's usage (GET /v1/usage)
    admin: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None

    def __repr__(self) -> str:
        return f"ApiKeyRow(id={self.id!r}, name={self.name!r}, owner={self.owner!r})"


LIMIT_COLUMNS = ("rpm", "tpm", "max_concurrent", "max_queued_tokens")


def insert_key(store: Store, *, key_id: str, name: str, owner: str, secret_hash: str,
               admin: bool = False, **limits: int | None) -> ApiKeyRow:
    row = ApiKeyRow(id=key_id, name=name, owner=owner, secret_hash=secret_hash,
                    created_at=utcnow(), admin=admin, **limits)
    with store.session() as s:
        s.add(row)
    return row


def get_key(store: Store, key_id: str) -> ApiKeyRow | None:
    with store.session() as s:
        return s.get(ApiKeyRow, key_id)


def update_key(store: Store, key_id: str, **values: Any) -> ApiKeyRow | None:
    """Set limits (LIMIT_COLUMNS; None clears one) or `admin` of a key; None if unknown."""
    bad = set(values) - set(LIMIT_COLUMNS) - {"admin"}
    if bad:
        raise ValueError(f"not a key setting: {sorted(bad)}")
    if values:
        with store.session() as s:
            s.execute(update(ApiKeyRow).where(ApiKeyRow.id == key_id).values(**values))
    return get_key(store, key_id)


def key_state(store: Store, key_id: str) -> Any:
    """The key's columns as they are now (the cached key's periodic re-check: revocation,
    limits), read as one row of plain columns (no ORM session: it runs per request when the
    key cache is off), or None. Attribute access as on ApiKeyRow."""
    columns = [ApiKeyRow.id, ApiKeyRow.name, ApiKeyRow.owner, ApiKeyRow.created_at,
               ApiKeyRow.revoked_at, ApiKeyRow.rpm, ApiKeyRow.tpm, ApiKeyRow.max_concurrent,
               ApiKeyRow.max_queued_tokens, ApiKeyRow.admin]
    with store.engine.connect() as conn:
        return conn.execute(select(*columns).where(ApiKeyRow.id == key_id)).first()


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
