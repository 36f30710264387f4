"""Owner-scoped request queries for the HTTP API.

The API files each request it accepts under the caller's owner by inserting the `queued`
row itself, before publishing to Kafka; the recorder's later upserts never clear it (a
NULL never erases a stored value). Lookups return a light row (no prompt) that the API
checks against the caller: another owner's id is answered like an unknown one.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import bindparam, delete, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Row
from sqlalchemy.exc import DBAPIError

from inflight.schemas.errors import StoreError

from inflight.store.models import QUEUED, RequestRow, utcnow
from inflight.store.queries import Store
from inflight.store.rows import clean_row

# What GET /v1/requests/{id} shows (not the prompt: it can be large and the caller has it).
VIEW_COLUMNS = (RequestRow.id, RequestRow.owner, RequestRow.status, RequestRow.batch_id,
                RequestRow.priority, RequestRow.output, RequestRow.output_token_ids,
                RequestRow.finish_reason, RequestRow.usage, RequestRow.timings, RequestRow.error,
                RequestRow.error_code, RequestRow.worker, RequestRow.attempts,
                RequestRow.created_at, RequestRow.started_at, RequestRow.finished_at,
                RequestRow.logprobs, RequestRow.tool_calls, RequestRow.model, RequestRow.embedding)
# NOTE: built once. Building a select per call costs more CPU than the query itself
# (SQLAlchemy derives the statement's cache key on each new object).
_VIEW_BY_ID = select(*VIEW_COLUMNS).where(RequestRow.id == bindparam("rid"))
_VIEWS_BY_IDS = select(*VIEW_COLUMNS).where(RequestRow.id.in_(bindparam("rids", expanding=True)))


def request_view(store: Store, request_id: str) -> Row | None:
    """The request's row (VIEW_COLUMNS, attribute access), or None. Read in autocommit
    mode: one statement, no BEGIN/ROLLBACK round trips. A pooled connection that turns out
    dead (database restarted; the API runs without pre-ping) is retried once on a new one."""
    return _read(store, _VIEW_BY_ID, {"rid": request_id}, repr(request_id), "first")


def request_views(store: Store, request_ids: set[str] | list[str]) -> dict[str, Row]:
    """request_view of many ids in one SELECT (the API's grouped polls): {id: row} of
    those that exist."""
    if not request_ids:
        return {}
    rows = _read(store, _VIEWS_BY_IDS, {"rids": sorted(request_ids)},
                 f"{len(request_ids)} request(s)", "all")
    return {r.id: r for r in rows}


def _read(store: Store, stmt: Any, params: dict[str, Any], what: str, fetch: str) -> Any:
    """`conn.execute(stmt, params).<fetch>()` in autocommit mode; retried once on a dead
    pooled connection."""
    for attempt in (1, 2):
        try:
            with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                return getattr(conn.execute(stmt, params), fetch)()
        except DBAPIError as exc:
            if attempt == 2 or not exc.connection_invalidated:
                raise StoreError(f"reading {what} failed: {exc.orig or exc}") from exc
    raise AssertionError("unreachable")


def claim_requests(store: Store, items: list[tuple[dict[str, Any], str | None]]) -> list[Row | None]:
    """Insert a `queued` row filed under its owner for each (row, owner) whose id does not
    exist yet, in ONE transaction (one commit, one WAL flush: the API's group commit of
    concurrent submits). Answers in the order given: None where this call inserted the
    row, else the existing row's view (the caller decides: same owner = the idempotent
    repeat, another owner = a conflict); of two items with one id, only the first can be
    the one that inserted it."""
    now = utcnow()
    first: dict[str, int] = {}
    values = []
    for i, (row, owner) in enumerate(items):
        if row["id"] not in first:
            first[row["id"]] = i
            values.append({**clean_row(row), "status": QUEUED, "owner": owner, "attempts": 0,
                           "created_at": row.get("created_at") or now, "updated_at": now})
    try:
        with store.engine.begin() as conn:
            inserted = set(conn.execute(_INSERT_IF_ABSENT[store.dialect], values).scalars())
    except DBAPIError as exc:
        raise StoreError(f"filing {len(values)} request(s) failed: {exc.orig or exc}") from exc
    mine = [first[rid] == i and rid in inserted for i, rid in enumerate(r["id"] for r, _ in items)]
    views = request_views(store, {r["id"] for (r, _), new in zip(items, mine) if not new})
    return [None if new else views.get(r["id"]) for (r, _), new in zip(items, mine)]


# INSERT ... ON CONFLICT (id) DO NOTHING RETURNING id, per dialect, built once (values are
# bound at execution, so SQLAlchemy compiles it once per set of columns).
# NOTE: RETURNING, not rowcount: psycopg reports rowcount -1 for it in autocommit mode;
# executed with a list of rows it is one multi-row INSERT ("insertmanyvalues").
_INSERT_IF_ABSENT = {
    name: dialect.insert(RequestRow.__table__).on_conflict_do_nothing(
        index_elements=[RequestRow.__table__.c.id]).returning(RequestRow.__table__.c.id)
    for name, dialect in (("postgresql", postgresql), ("sqlite", sqlite))}


def release_request(store: Store, request_id: str, owner: str | None) -> None:
    """Undo claim_requests for one row after the publish failed: the row goes only if it is still
    `queued` and still ours (the client was told 503 and may retry with the same id)."""
    owner_is = RequestRow.owner.is_(None) if owner is None else RequestRow.owner == owner
    with store.session() as s:
        s.execute(delete(RequestRow).where(RequestRow.id == request_id,
                                           RequestRow.status == QUEUED, owner_is))
