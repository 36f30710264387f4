"""Owner-scoped request queries for the HTTP API.

The API files each request it accepts under the caller's owner by inserting the `queued`
row itself, before publishing to Kafka; the recorder's later upserts never clear it (a
NULL never erases a stored value). Lookups return a light row (no prompt) that the API
checks against the caller: another owner's id is answered like an unknown one.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Row

from store.models import QUEUED, RequestRow, utcnow
from store.queries import Store

# What GET /v1/requests/{id} shows (not the prompt: it can be large and the caller has it).
VIEW_COLUMNS = (RequestRow.id, RequestRow.owner, RequestRow.status, RequestRow.batch_id,
                RequestRow.priority, RequestRow.output, RequestRow.output_token_ids,
                RequestRow.finish_reason, RequestRow.usage, RequestRow.timings, RequestRow.error,
                RequestRow.error_code, RequestRow.worker, RequestRow.attempts,
                RequestRow.created_at, RequestRow.started_at, RequestRow.finished_at)
_VIEW = select(*VIEW_COLUMNS)


def request_view(store: Store, request_id: str) -> Row | None:
    """The request's row (VIEW_COLUMNS, attribute access), or None."""
    with store.engine.connect() as conn:
        return conn.execute(_VIEW.where(RequestRow.id == request_id)).first()


def claim_request(store: Store, row: dict[str, Any], owner: str | None) -> Row | None:
    """Insert a `queued` row filed under `owner` unless the id exists. Returns None when
    this call inserted it, else the existing row's view (the caller decides: same owner =
    the idempotent repeat, another owner = a conflict)."""
    now = utcnow()
    values = {**row, "status": QUEUED, "owner": owner, "attempts": 0,
              "created_at": row.get("created_at") or now, "updated_at": now}
    table = RequestRow.__table__
    insert = postgresql.insert if store.dialect == "postgresql" else sqlite.insert
    stmt = insert(table).values(values).on_conflict_do_nothing(index_elements=[table.c.id])
    with store.session() as s:
        inserted = s.execute(stmt).rowcount == 1
    return None if inserted else request_view(store, row["id"])


def release_request(store: Store, request_id: str, owner: str | None) -> None:
    """Undo claim_request after the publish failed: the row goes only if it is still
    `queued` and still ours (the client was told 503 and may retry with the same id)."""
    owner_is = RequestRow.owner.is_(None) if owner is None else RequestRow.owner == owner
    with store.session() as s:
        s.execute(delete(RequestRow).where(RequestRow.id == request_id,
                                           RequestRow.status == QUEUED, owner_is))
