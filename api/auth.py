"""Who is calling: bearer API keys, checked cheaply on every request.

    Authorization: Bearer inf_...      (OpenAI SDK)      x-api-key: inf_...   (Anthropic SDK)

`KeyCache.authenticate` answers from memory for a key verified within the last
`INFLIGHT_API_KEY_CACHE_S` seconds. Past that, it re-reads only the row's revocation (one
primary-key lookup); the argon2 verification runs once per key per process. A revoked key
is refused by every process within that many seconds; changed limits apply as soon.

NOTE: a failed token is remembered (by digest) for a few seconds and at most two argon2
verifications run at once, so a flood of bad keys cannot eat the CPU that polls need.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass

import anyio
from anyio import to_thread

from inflight.api.errors import APIError
from inflight.api.keys import KeyInfo, lookup
from inflight.api.rate_limits import Limits
from inflight.store import Store
from inflight.store.keys import key_state

log = logging.getLogger("inflight.api")

MAX_CACHED = 10_000
FAILED_TTL_S = 5.0


@dataclass(frozen=True)
class Principal:
    """The caller. `owner` files and scopes rows; None only with INFLIGHT_API_AUTH=off."""

    owner: str | None
    key_id: str | None = None
    # the key's limits (api/rate_limits.py; None: unlimited) and whether it sees all usage
    limits: "Limits | None" = None
    admin: bool = False


ANONYMOUS = Principal(owner=None)


def unauthorized(message: str) -> APIError:
    return APIError(401, message, code="invalid_api_key",
                    headers={"WWW-Authenticate": 'Bearer realm="inflight"'})


def _principal(info: KeyInfo) -> Principal:
    return Principal(owner=info.owner, key_id=info.id, limits=Limits.of(info), admin=info.admin)


class KeyCache:
    def __init__(self, store: Store, ttl_s: float, db_slots: anyio.CapacityLimiter):
        self.store = store
        self.ttl_s = ttl_s
        self._db_slots = db_slots
        self._good: OrderedDict[bytes, tuple[Principal, float]] = OrderedDict()
        self._bad: OrderedDict[bytes, float] = OrderedDict()
        self._verify_slots = anyio.CapacityLimiter(2)

    async def authenticate(self, token: str | None) -> Principal:
        if token is None:
            raise unauthorized("no API key: send `Authorization: Bearer <key>` (create one "
                               "with `inflight keys create NAME`)")
        digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
        now = time.monotonic()
        hit = self._good.get(digest)
        if hit is not None:
            principal, checked = hit
            if now - checked < self.ttl_s:
                return principal
            row = await to_thread.run_sync(key_state, self.store, principal.key_id,
                                           limiter=self._db_slots)
            if row is None or row.revoked_at is not None:
                self._good.pop(digest, None)
                raise unauthorized("this API key was revoked; create a new one")
            principal = _principal(KeyInfo.of(row))  # limits changed since: seen now
            self._good[digest] = (principal, now)
            self._good.move_to_end(digest)
            return principal
        bad_until = self._bad.get(digest)
        if bad_until is not None and now < bad_until:
            raise unauthorized("invalid API key")
        info: KeyInfo | None = await to_thread.run_sync(lookup, self.store, token,
                                                        limiter=self._verify_slots)
        if info is None:
            self._remember(self._bad, digest, time.monotonic() + FAILED_TTL_S)
            raise unauthorized("invalid API key (unknown, revoked or mistyped)")
        principal = _principal(info)
        self._remember(self._good, digest, (principal, time.monotonic()))
        return principal

    @staticmethod
    def _remember(cache: OrderedDict, digest: bytes, value: object) -> None:
        cache[digest] = value
        cache.move_to_end(digest)
        while len(cache) > MAX_CACHED:
            cache.popitem(last=False)
