"""`Store`: an engine + sessionmaker and the queries the service needs.

Idempotent upsert (the recorder's only write):

    INSERT INTO requests (...) VALUES (...), (...), ...          -- one statement per batch
      (Postgres: ... SELECT ... FROM unnest(<one array per column>); see _pg_upsert_sql)
    ON CONFLICT (id) DO UPDATE SET col = COALESCE(excluded.col, requests.col), ...
    WHERE rank(excluded.status) > rank(requests.status)
       OR (rank(excluded.status) = rank(requests.status) AND rank(requests.status) < 2)

NOTE: so a final row (completed/failed/cancelled/expired), once written, is never
overwritten — not by a duplicate final (first wins), not by a late queued/running; a
NULL in the new row never erases a value already stored.

The describing columns (_FILL_ONLY: prompt, params, batch_id, priority, custom_id,
owner) follow their own rule, first value wins: they are filled where missing (also by a
row that does not move forward) and never replaced (also not by one that does). Events
can reach the recorder out of order (the final event before the queued one, from
different topics), and the final row must not lose the prompt; and a second submission
of the same request_id (the idempotency key) carrying another prompt must not overwrite
the first one's prompt and params, which is what the worker ran.
"""

from __future__ import annotations

import contextlib
import functools
import json
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import orjson
from sqlalchemy import String, any_, bindparam, case, create_engine, event, func, or_, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import DBAPIError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from inflight.schemas.errors import StoreError
from inflight.store.batch_queries import BatchQueries
from inflight.store.files import FileQueries
from inflight.store.models import QUEUED, STATUS_RANK, STATUSES, ExactText, RequestRow, utcnow
from inflight.store.urls import normalize_url, redact

_REQUEST_COLUMNS = tuple(c.name for c in RequestRow.__table__.columns)
_REQUEST_COLUMN_SET = frozenset(_REQUEST_COLUMNS)
_KEEP_ON_CONFLICT = {"id", "created_at"}
_FILL_ONLY = ("prompt", "params", "batch_id", "priority", "custom_id", "owner", "trace_id",
              "tenant")
UPSERT_CHUNK = 500  # rows per INSERT statement (SQLite caps bound parameters)
PG_UPSERT_CHUNK = 5000  # rows per INSERT statement on Postgres (its parameters are arrays)


# plain scalar columns, which Postgres takes as one array per column (insert_requests),
# and their array types (text, not varchar(n): an explicit cast to varchar(n) would cut a
# long value silently, where the insert into the column refuses it)
_UNNEST_COLUMNS = {"id": "text", "batch_id": "text", "custom_id": "text", "owner": "text",
                   "model": "text", "tenant": "text", "tokens": "bigint",
                   "status": "text", "priority": "integer", "attempts": "integer",
                   "created_at": "timestamptz", "updated_at": "timestamptz"}


@functools.lru_cache(maxsize=16)
def _pg_insert_sql(cols: tuple[str, ...]) -> str:
    """INSERT INTO requests (cols) SELECT * FROM unnest(%(c1)b::type[], ...) ON CONFLICT
    (id) DO NOTHING: one statement, one binary array parameter per column, for a whole
    chunk of the batch enqueue's rows.

    NOTE: executemany sent each row's parameters through SQLAlchemy's and psycopg's
    per-row bind processing (and Postgres one INSERT per row)."""
    arrays = ", ".join(f"%({c})b::{_UNNEST_COLUMNS[c]}[]" for c in cols)
    return (f"INSERT INTO {RequestRow.__tablename__} ({', '.join(cols)}) "
            f"SELECT * FROM unnest({arrays}) ON CONFLICT (id) DO NOTHING")


def _rank(column: Any) -> Any:
    return case({s: r for s, r in STATUS_RANK.items()}, value=column, else_=0)


def _json(value: Any) -> str:
    """A JSON column's value as text, as SQLAlchemy's JSON type would send it (orjson:
    NaN/inf become null, which Postgres' JSONB would refuse as NaN anyway)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    except orjson.JSONEncodeError:  # e.g. an int over 64 bits, which JSONB takes
        return json.dumps(value)


def _merge(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """The upsert's rule, in Python: fold duplicates of one id within one batch (two
    different attempts are never folded: _separate)."""
    if old is None:
        return new
    r_old, r_new = STATUS_RANK[old["status"]], STATUS_RANK[new["status"]]
    fills = {k: new[k] for k in _FILL_ONLY if old[k] is None and new[k] is not None}
    attempt = {"attempts": max(old["attempts"], new["attempts"]),
               "attempt_started_at": old["attempt_started_at"] or new["attempt_started_at"]}
    if r_new > r_old or (r_new == r_old and r_old < 2):
        return {k: (new[k] if new[k] is not None or k in _KEEP_ON_CONFLICT else old[k])
                for k in new} | {k: old[k] for k in _FILL_ONLY} | fills | {
                    "created_at": old["created_at"]} | attempt
    return old | fills | attempt


def _separate(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Two rows of one id that carry two different attempts: each must meet the stored row
    on its own, so the upsert counts each once (and a replayed one not at all)."""
    a, b = old["attempt_started_at"], new["attempt_started_at"]
    return a is not None and b is not None and a != b


def is_transient(exc: BaseException) -> bool:
    """A StoreError because the database is away or the connection broke (retry it), as
    opposed to the database refusing the data (retrying the same data fails again)."""
    cause = exc.__cause__
    return isinstance(exc, StoreError) and (isinstance(cause, OperationalError) or (
        isinstance(cause, DBAPIError) and cause.connection_invalidated))


class Store(BatchQueries, FileQueries):
    """The SQL store (requests here; batches in store.batch_queries, files in store.files). `Store(url)` expects migrated tables (run `inflight db upgrade`);
    `Store(url, create=True)` runs the Alembic migrations first (tests, embedded SQLite)."""

    def __init__(self, url: str, *, create: bool = False, echo: bool = False,
                 pre_ping: bool = True, files_url: str | None = None,
                 files_endpoint: str | None = None):
        """`files_url`: s3://bucket/prefix for file content (store.object_files)."""
        self.url = normalize_url(url)
        self.files_endpoint = files_endpoint
        self.objects = None
        if files_url:
            from inflight.store.object_files import ObjectFiles

            self.objects = ObjectFiles(files_url, endpoint=files_endpoint)
        # pre_ping=False saves a round trip per checkout (the HTTP API's polls); a
        # connection found dead then fails one statement and the pool is invalidated.
        kwargs: dict[str, Any] = {"pool_pre_ping": pre_ping, "echo": echo}
        self.dialect = make_url(self.url).get_backend_name()
        if self.dialect == "sqlite":
            kwargs["connect_args"] = {"timeout": 30, "check_same_thread": False}
        elif self.dialect != "postgresql":
            raise StoreError(f"unsupported database {redact(self.url)}: use postgresql+psycopg:// "
                             "or sqlite:/// (setting INFLIGHT_DATABASE_URL)")
        try:
            self.engine: Engine = create_engine(self.url, **kwargs)
        except (SQLAlchemyError, ImportError) as e:
            raise StoreError(f"cannot open database {redact(self.url)}: {e}") from e
        if self.dialect == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._insert = postgresql.insert if self.dialect == "postgresql" else sqlite.insert
        # attempts never go down (SQLite's two-argument max() is GREATEST)
        self._greatest = func.greatest if self.dialect == "postgresql" else func.max
        self._upsert: Any = None
        self._pg_upsert: Any = None
        if create:
            from inflight.store.migrate import upgrade
            upgrade(self.url, quiet=True)

    @classmethod
    def embedded(cls, url: str, *, pre_ping: bool = True, files_url: str | None = None,
                 files_endpoint: str | None = None) -> "Store":
        """The embedded default: a SQLite file is created and migrated on first use (a
        Postgres URL is not — production databases are migrated by `inflight db upgrade`)."""
        norm = normalize_url(url)
        return cls(norm, create=make_url(norm).get_backend_name() == "sqlite", pre_ping=pre_ping,
                   files_url=files_url, files_endpoint=files_endpoint)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def session(self) -> Iterator[Session]:
        """A transaction; database trouble becomes StoreError (callers retry)."""
        try:
            with self.sessions.begin() as s:
                yield s
        except (OperationalError, DBAPIError) as e:
            if isinstance(e, OperationalError) or e.connection_invalidated:
                raise StoreError(
                    f"database {redact(self.url)} is unreachable or failed: {e.orig or e}. "
                    "Check INFLIGHT_DATABASE_URL and that the server is up; the operation "
                    "was not applied and can be retried.") from e
            raise StoreError(f"database error on {redact(self.url)}: {e.orig or e}") from e
        except (SQLAlchemyError, UnicodeError) as e:
            # a value the driver cannot send (bind processing, an unencodable string): the
            # data is refused, the database is fine (callers must not retry it as is)
            raise StoreError(f"database {redact(self.url)} cannot take a value: {e}") from e

    # --- requests ---------------------------------------------------------------------

    def upsert_requests(self, rows: Iterable[Mapping[str, Any]]) -> int:
        """Insert or move forward request rows by id, idempotently (see module doc).

        Each row is a mapping of `requests` columns; `id` and `status` are required, the
        rest optional (see store.rows for builders). Returns the number of distinct ids sent.
        """
        # NOTE: rows of one id are folded into one (a statement may touch a row once),
        # except two attempts of it, which go in successive rounds (statements)
        rounds: list[dict[str, dict[str, Any]]] = [{}]
        last: dict[str, int] = {}
        now = utcnow()
        for row in rows:
            unknown = set(row) - set(_REQUEST_COLUMNS)
            if unknown:
                raise ValueError(f"unknown requests column(s) {sorted(unknown)}")
            if row.get("status") not in STATUSES:
                raise ValueError(f"row {row.get('id')!r}: status {row.get('status')!r} is not "
                                 f"one of {STATUSES}")
            if not row.get("id"):
                raise ValueError("row without id")
            full = {c: row.get(c) for c in _REQUEST_COLUMNS}
            full["created_at"] = full["created_at"] or now
            full["attempts"] = full["attempts"] or 0
            full["updated_at"] = now
            rid = full["id"]
            i = last.get(rid, 0)
            cur = rounds[i].get(rid)
            if cur is not None and _separate(cur, full):
                i, cur = i + 1, None
                if i == len(rounds):
                    rounds.append({})
            rounds[i][rid] = _merge(cur, full)
            last[rid] = i
        if not last:
            return 0
        if self.dialect == "postgresql":
            sql, columns = self._pg_upsert_sql()
            with self.session() as s:
                conn = s.connection()
                for merged in rounds:
                    values = list(merged.values())
                    for start in range(0, len(values), PG_UPSERT_CHUNK):
                        conn.exec_driver_sql(sql, columns(values[start:start + PG_UPSERT_CHUNK]))
            return len(last)
        stmt = self._upsert_stmt()
        with self.session() as s:
            for merged in rounds:
                values = list(merged.values())
                for start in range(0, len(values), UPSERT_CHUNK):
                    # NOTE: one statement, many parameter sets: SQLAlchemy compiles it once
                    # and sends the rows as multi-VALUES batches ("insertmanyvalues"). Rows
                    # inlined with .values([...]) were compiled anew per batch: over half the
                    # recorder's time at a few thousand rows a second.
                    s.execute(stmt, values[start:start + UPSERT_CHUNK])
        return len(last)

    def _upsert_stmt(self) -> Any:
        """INSERT ... ON CONFLICT (id) DO UPDATE with the forward-only rule (built once)."""
        if self._upsert is None:
            table = RequestRow.__table__
            stmt = self._insert(table)
            new, old = stmt.excluded, table.c
            r_new, r_old = _rank(new.status), _rank(old.status)
            forward = (r_new > r_old) | ((r_new == r_old) & (r_old < 2))
            fills = [old[c].is_(None) & new[c].is_not(None) for c in _FILL_ONLY]
            set_ = {c: case((forward, func.coalesce(new[c], old[c])), else_=old[c])
                    for c in _REQUEST_COLUMNS
                    if c not in _KEEP_ON_CONFLICT and c not in _FILL_ONLY}
            set_ |= {c: func.coalesce(old[c], new[c]) for c in _FILL_ONLY}  # first wins
            # an admission later than the last one counted is a new attempt, whatever the
            # status (a request run again after its final event was written counts too); a
            # replayed one is not later, so it counts nothing
            new_attempt = new.attempt_started_at.is_not(None) & (
                old.attempt_started_at.is_(None)
                | (new.attempt_started_at > old.attempt_started_at))
            set_["attempts"] = case((new_attempt, old.attempts + 1),
                                    (forward, self._greatest(new.attempts, old.attempts)),
                                    else_=old.attempts)
            set_["attempt_started_at"] = case((new_attempt, new.attempt_started_at),
                                              else_=old.attempt_started_at)
            self._upsert = stmt.on_conflict_do_update(index_elements=[table.c.id], set_=set_,
                                                      where=or_(forward, new_attempt, *fills))
        return self._upsert

    def _pg_upsert_sql(self) -> tuple[str, Any]:
        """Postgres: the upsert of _upsert_stmt as one statement over column arrays,

            INSERT INTO requests (id, ...) SELECT t.id, ... FROM unnest(%(id)s::TEXT[],
                ...) AS t(id, ...) ON CONFLICT ...              -- the same rule, same text

        and the function that turns rows into its parameters (one list per column).

        NOTE (why): the statement text never changes (psycopg parses it once, Postgres
        plans it once) and each row costs a few list appends. The executemany form sent
        one INSERT per row, each parsed and planned by Postgres and parameter-processed by
        SQLAlchemy in the recorder; a multi-VALUES INSERT (insertmanyvalues) saved the
        server's share but psycopg re-parsed its ever-different text (docs/benchmarks.md).
        """
        if self._pg_upsert is None:
            table = RequestRow.__table__
            dialect = postgresql.dialect()
            upsert = str(self._upsert_stmt().compile(dialect=dialect,
                                                      compile_kwargs={"literal_binds": True}))
            on_conflict = upsert[upsert.index(" ON CONFLICT "):]
            types = {c.name: c.type.compile(dialect=dialect) for c in table.columns}
            json_cols = {c for c, t in types.items() if t == "JSONB"}
            time_cols = {c for c, t in types.items() if "TIMESTAMP" in t}
            exact_cols = {c.name: c.type.bind_processor(dialect) or (lambda v: v)
                          for c in table.columns if isinstance(c.type, ExactText)}
            cols = _REQUEST_COLUMNS
            # binary arrays: no per-element escaping. JSON and VARCHAR(n) columns travel as
            # TEXT[]: an explicit ::VARCHAR(n)[] cast would cut a long value silently, where
            # the insert's assignment into the column refuses it (like every other path)
            array_type = {c: "TEXT" if c in json_cols or t.startswith("VARCHAR") else t
                          for c, t in types.items()}
            arrays = ", ".join(f"%({c})b::{array_type[c]}[]" for c in cols)
            select = ", ".join(f"t.{c}::JSONB" if c in json_cols else f"t.{c}" for c in cols)
            sql = (f"INSERT INTO {table.name} ({', '.join(cols)}) SELECT {select} "
                   f"FROM unnest({arrays}) AS t({', '.join(cols)}){on_conflict}")

            def columns(rows: list[dict[str, Any]]) -> dict[str, list]:
                out = {}
                for c in cols:
                    vals = [r[c] for r in rows]
                    if c in json_cols:
                        vals = [None if v is None else _json(v) for v in vals]
                    elif c in exact_cols:  # the column type's own escape (ExactText)
                        vals = [exact_cols[c](v) for v in vals]
                    elif c in time_cols and any(v is not None and v.tzinfo is None
                                                for v in vals):
                        raise StoreError(f"naive datetime in {c}: pass an aware one "
                                         "(timezone.utc)")
                    out[c] = vals
                return out

            self._pg_upsert = (sql, columns)
        return self._pg_upsert

    def insert_requests(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Insert `queued` request rows; ids already stored are left as they are (INSERT ...
        ON CONFLICT DO NOTHING). The batch enqueue task writes its rows this way before
        publishing them, so a retried task changes nothing already recorded."""
        now = utcnow()
        rows = list(rows)
        if not rows:
            return
        given = {c for row in rows for c in row}
        unknown = given - _REQUEST_COLUMN_SET
        if unknown:
            raise ValueError(f"unknown requests column(s) {sorted(unknown)}")
        defaults = {"status": QUEUED, "created_at": now, "updated_at": now, "attempts": 0}
        if self.dialect == "postgresql" and given <= _UNNEST_COLUMNS.keys():
            cols = [c for c in _REQUEST_COLUMNS if c in given or c in defaults]
            arrays = {c: [row.get(c) for row in rows] for c in cols if c in given}
            for c, v in defaults.items():
                if c == "updated_at" or c not in arrays:
                    arrays[c] = [v] * len(rows)
                else:
                    arrays[c] = [x if x is not None else v for x in arrays[c]]
            if any(v is not None and v.tzinfo is None
                   for v in arrays["created_at"]):
                raise StoreError("naive datetime in created_at: pass an aware one "
                                 "(timezone.utc)")
            with self.session() as s:
                s.connection().exec_driver_sql(_pg_insert_sql(tuple(cols)), arrays)
            return
        values = []
        for row in rows:
            full = {c: row.get(c) for c in _REQUEST_COLUMNS}
            full["status"] = full["status"] or QUEUED
            full["created_at"] = full["created_at"] or now
            full["updated_at"] = now
            full["attempts"] = full["attempts"] or 0
            values.append(full)
        table = RequestRow.__table__
        # NOTE: executemany (one cached statement; SQLAlchemy batches it as "insertmanyvalues"),
        # not .values([...]): compiling a long VALUES list costs more than the rows' insert.
        stmt = self._insert(table).on_conflict_do_nothing(index_elements=[table.c.id])
        with self.session() as s:
            s.execute(stmt, values)

    def get_request(self, request_id: str) -> RequestRow | None:
        with self.session() as s:
            return s.get(RequestRow, request_id)

    def get_requests(self, request_ids: Iterable[str]) -> dict[str, RequestRow]:
        ids = list(request_ids)
        if not ids:
            return {}
        with self.session() as s:
            rows = s.scalars(select(RequestRow).where(RequestRow.id.in_(ids))).all()
            return {r.id: r for r in rows}

    def result_rows(self, request_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        """{id: {status, output, finish_reason, usage, error, error_code, finished_at,
        tool_calls}} for
        the ids that exist: plain dicts through Core (no ORM objects), for writing large
        batch result files."""
        ids = list(request_ids)
        if not ids:
            return {}
        t = RequestRow.__table__.c
        cols = (t.id, t.status, t.output, t.finish_reason, t.usage, t.error, t.error_code,
                t.finished_at, t.tool_calls, t.embedding)
        if self.dialect == "postgresql":  # one array parameter, not a thousand binds
            cond = t.id == any_(bindparam("ids", ids, type_=postgresql.ARRAY(String)))
        else:
            cond = t.id.in_(ids)
        with self.session() as s:
            return {r.id: r._asdict() for r in s.execute(select(*cols).where(cond))}

    def list_batch(self, batch_id: str, *, status: str | Iterable[str] | None = None,
                   after: str | None = None, limit: int = 1000) -> list[RequestRow]:
        """A batch's requests ordered by id; page with `after=<last id>`."""
        q = select(RequestRow).where(RequestRow.batch_id == batch_id)
        if status is not None:
            q = q.where(RequestRow.status.in_([status] if isinstance(status, str) else list(status)))
        if after is not None:
            q = q.where(RequestRow.id > after)
        with self.session() as s:
            return list(s.scalars(q.order_by(RequestRow.id).limit(limit)).all())

    def count_by_status(self, batch_id: str | None = None) -> dict[str, int]:
        """{status: count} with every status present (zeros included)."""
        q = select(RequestRow.status, func.count()).group_by(RequestRow.status)
        if batch_id is not None:
            q = q.where(RequestRow.batch_id == batch_id)
        counts = dict.fromkeys(STATUSES, 0)
        with self.session() as s:
            for status, n in s.execute(q):
                counts[status] = n
        return counts


_pragma_lock = threading.Lock()


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    # WAL lets the recorder write while others read; busy_timeout waits out short locks.
    with _pragma_lock:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.close()
