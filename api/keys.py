"""API keys: make, check, list and revoke (what `inflight keys ...` and the API use).

A key reads `inf_<12 hex: key id>_<48 hex: secret>`. The id finds the row; the secret is
checked against the row's argon2 hash. The plain key is shown once, at creation.

NOTE: the secret is 192 random bits, not a password, so no dictionary attack applies; the
argon2 parameters are kept light (8 MiB, one pass) because a bad key costs a verification.
The API verifies a key once per process and then trusts a cache that re-checks only the
row's revocation every `INFLIGHT_API_KEY_CACHE_S` (api/auth.py).
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from datetime import datetime

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

from inflight.schemas.base import ID_RE
from inflight.schemas.errors import ConfigError
from inflight.store import Store
from inflight.store.keys import (LIMIT_COLUMNS, ApiKeyRow, get_key, insert_key, list_keys,
                                 revoke_key, update_key)

TOKEN_RE = re.compile(r"^inf_([0-9a-f]{12})_([0-9a-f]{48})$")
KEY_ID_RE = re.compile(r"^key_[0-9a-f]{12}$")
NAME_MAX = 128

_HASHER = PasswordHasher(time_cost=1, memory_cost=8192, parallelism=1)


@dataclass(frozen=True)
class KeyInfo:
    """A key as listed (never with its secret)."""

    id: str
    name: str
    owner: str
    created_at: datetime
    revoked_at: datetime | None
    rpm: int | None = None                # requests per minute
    tpm: int | None = None                # tokens per minute (prompt + max_tokens reserved)
    max_concurrent: int | None = None     # interactive requests queued or running at once
    max_queued_tokens: int | None = None  # tokens of batches not yet final
    admin: bool = False                   # sees every owner's usage

    @classmethod
    def of(cls, row: ApiKeyRow) -> "KeyInfo":
        return cls(row.id, row.name, row.owner, row.created_at, row.revoked_at, row.rpm,
                   row.tpm, row.max_concurrent, row.max_queued_tokens, bool(row.admin))

    @property
    def limits(self) -> dict[str, int | None]:
        return {name: getattr(self, name) for name in LIMIT_COLUMNS}

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None


@dataclass(frozen=True)
class NewKey:
    info: KeyInfo
    token: str  # shown once; only its hash is stored


def parse_token(token: str) -> tuple[str, str] | None:
    """(key id, secret) of a well-formed key, else None."""
    m = TOKEN_RE.match(token)
    if m is None:
        return None
    return f"key_{m.group(1)}", m.group(2)


def _check_limits(limits: dict[str, int | None]) -> dict[str, int | None]:
    bad = set(limits) - set(LIMIT_COLUMNS)
    if bad:
        raise ConfigError(f"key limits: unknown {sorted(bad)}; use {', '.join(LIMIT_COLUMNS)}")
    for name, value in limits.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise ConfigError(f"key limit {name}={value!r}: give a whole number >= 1 (or "
                              "none to lift it)")
    return limits


def create_key(store: Store, name: str, owner: str | None = None, *, admin: bool = False,
               **limits: int | None) -> NewKey:
    """A new key named `name`. Its rows are filed under `owner` (default: the key's own id;
    give several keys one owner to rotate keys without losing access to old rows).
    `limits`: rpm, tpm, max_concurrent, max_queued_tokens (api/rate_limits.py); `admin`:
    the key sees every owner's usage."""
    _check_limits(limits)
    if not name or len(name) > NAME_MAX or not name.isprintable():
        raise ConfigError(f"key name: give 1-{NAME_MAX} printable characters (got {name!r:.80})")
    if owner is not None and not ID_RE.match(owner):
        raise ConfigError("key owner: use 1-128 letters, digits and . _ : - starting with a "
                          f"letter or digit (got {owner!r:.80})")
    hex_id, secret = secrets.token_hex(6), secrets.token_hex(24)
    key_id = f"key_{hex_id}"
    row = insert_key(store, key_id=key_id, name=name, owner=owner or key_id,
                     secret_hash=_HASHER.hash(secret), admin=admin,
                     **{k: v for k, v in limits.items() if v is not None})
    return NewKey(KeyInfo.of(row), f"inf_{hex_id}_{secret}")


def verify_secret(secret_hash: str, secret: str) -> bool:
    try:
        return _HASHER.verify(secret_hash, secret)
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False


def lookup(store: Store, token: str) -> KeyInfo | None:
    """The key this token is, when it is well formed, known, not revoked and its secret
    matches; else None. Costs one argon2 verification (cache the answer)."""
    parsed = parse_token(token)
    if parsed is None:
        return None
    key_id, secret = parsed
    row = get_key(store, key_id)
    if row is None or row.revoked or not verify_secret(row.secret_hash, secret):
        return None
    return KeyInfo.of(row)


def all_keys(store: Store, include_revoked: bool = True) -> list[KeyInfo]:
    return [KeyInfo.of(r) for r in list_keys(store, include_revoked=include_revoked)]


def update(store: Store, key_id: str, *, admin: bool | None = None,
           **limits: int | None) -> KeyInfo | None:
    """Change a key's limits (a value of None lifts that limit) and/or admin flag; None
    when no such key exists. API processes see it within INFLIGHT_API_KEY_CACHE_S."""
    if not KEY_ID_RE.match(key_id):
        raise ConfigError(f"key id: expected key_ and 12 hex digits, as `inflight keys list` "
                          f"shows (got {key_id!r:.80})")
    values: dict = dict(_check_limits(limits))
    if admin is not None:
        values["admin"] = admin
    row = update_key(store, key_id, **values)
    return None if row is None else KeyInfo.of(row)


def revoke(store: Store, key_id: str) -> KeyInfo | None:
    """Revoke by id (`key_...`); None when no such key exists."""
    if not KEY_ID_RE.match(key_id):
        raise ConfigError(f"key id: expected key_ and 12 hex digits, as `inflight keys list` "
                          f"shows (got {key_id!r:.80})")
    row = revoke_key(store, key_id)
    return None if row is None else KeyInfo.of(row)
