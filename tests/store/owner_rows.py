"""One-row forms of store.owner_queries' grouped calls, for tests (the API files requests
in groups: api/group_commit.py)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Row

from inflight.store.owner_queries import claim_requests
from inflight.store.queries import Store


def claim_request(store: Store, row: dict[str, Any], owner: str | None) -> Row | None:
    """Insert a `queued` row filed under `owner` unless the id exists. Returns None when
    this call inserted it, else the existing row's view."""
    return claim_requests(store, [(row, owner)])[0]
