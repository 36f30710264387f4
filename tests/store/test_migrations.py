"""Alembic: upgrade from an empty database, on SQLite and Postgres."""

from __future__ import annotations

import os

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text

from inflight.store import Store, upgrade
from inflight.store.migrate import current_revision, downgrade, head_revision
from inflight.store.models import Base


def _tables(url: str) -> dict[str, set[str]]:
    engine = create_engine(url)
    try:
        insp = inspect(engine)
        return {t: {ix["name"] for ix in insp.get_indexes(t)} for t in insp.get_table_names()}
    finally:
        engine.dispose()


def test_upgrade_from_empty_database(empty_db_url, tmp_path, monkeypatch):
    url = Store(empty_db_url).url  # normalized form
    assert _tables(url) == {}
    monkeypatch.chdir(tmp_path)  # works from any working directory
    upgrade(url)
    tables = _tables(url)
    assert {"ix_requests_status", "ix_requests_batch_id"} <= tables["requests"]
    assert {"ix_batches_status", "ix_batches_owner", "ix_batches_created_at"} <= tables["batches"]
    assert "ix_requests_owner" in tables["requests"]
    assert {"files", "file_chunks"} <= set(tables)
    assert "ix_api_keys_owner" in tables["api_keys"]
    assert "ix_requests_model" in tables["requests"]
    assert current_revision(url) == head_revision()   # one head: the chain is linear
    upgrade(url)  # a second upgrade is a no-op
    assert current_revision(url) == head_revision()


def test_models_match_the_migration(empty_db_url):
    url = Store(empty_db_url).url
    upgrade(url)
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    finally:
        engine.dispose()
    assert diff == [], "store/models.py and migrations/ disagree; write a new migration"


def test_downgrade_to_base_and_back(empty_db_url):
    url = Store(empty_db_url).url
    upgrade(url)
    downgrade(url, "base")
    assert set(_tables(url)) <= {"alembic_version"}
    upgrade(url)
    assert {"requests", "batches"} <= set(_tables(url))


def test_embedded_sqlite_is_created_on_first_use(tmp_path):
    path = tmp_path / "deep" / "dir" / "inflight.db"
    with Store.embedded(f"sqlite:///{path}") as s:
        assert os.path.exists(path)
        assert s.count_by_status()["queued"] == 0


_T0 = "2026-11-01 10:00:00+00:00"
_T1 = "2026-11-01 11:00:00+00:00"


def _exec(url: str, *statements: tuple[str, dict]) -> None:
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            for sql, params in statements:
                conn.execute(text(sql), params)
    finally:
        engine.dispose()


def test_upgrade_0001_to_0002_keeps_the_data(empty_db_url):
    """A 0001 database with requests and batches in every old status: after the upgrade
    every row is there, mapped to the new shape; the downgrade maps them back."""
    url = Store(empty_db_url).url
    upgrade(url, "0001")
    is_pg = url.startswith("postgresql")
    js = "CAST(:p AS JSONB)" if is_pg else ":p"
    old = ["queued", "running", "completed", "failed", "cancelled", "expired"]
    _exec(url, *[(f"INSERT INTO requests (id, batch_id, status, prompt, params, output, attempts, "
                  f"created_at, updated_at) VALUES (:id, 'b-completed', :st, {js}, {js.replace(':p', ':q')}, "
                  ":out, 1, :t0, :t1)",
                  {"id": f"r{i}", "st": st, "p": '"hello"', "q": '{"max_tokens": 4}',
                   "out": "hi" if st == "completed" else None, "t0": _T0, "t1": _T1})
                 for i, st in enumerate(old)],
          *[("INSERT INTO batches (id, status, total, completed, failed, cancelled, input, output, "
             "error, created_at, updated_at, finished_at) VALUES (:id, :st, 6, 1, 1, 1, "
             "'/data/in.jsonl', :out, :err, :t0, :t1, :fin)",
             {"id": f"b-{st}", "st": st, "out": "/data/out.jsonl" if st == "completed" else None,
              "err": "boom" if st == "failed" else None, "t0": _T0, "t1": _T1,
              "fin": _T1 if st in ("completed", "failed", "cancelled", "expired") else None})
            for st in old])
    upgrade(url, "0002")
    assert current_revision(url) == "0002"
    upgrade(url)  # on to head: today's models read the rows
    with Store(url) as s:
        rows = {r.id: r for r in s.list_batch("b-completed", limit=100)}
        assert sorted(rows) == [f"r{i}" for i in range(6)]
        assert [rows[f"r{i}"].status for i in range(6)] == old
        assert rows["r2"].output == "hi" and rows["r0"].prompt == "hello"
        assert rows["r0"].params == {"max_tokens": 4} and rows["r0"].custom_id is None
        batches = {b.id: b for b in s.list_batches(limit=100)}
        assert {k: b.status for k, b in batches.items()} == {
            "b-queued": "in_progress", "b-running": "in_progress", "b-completed": "completed",
            "b-failed": "failed", "b-cancelled": "cancelled", "b-expired": "expired"}
        done = batches["b-completed"]
        assert (done.request_total, done.request_completed, done.request_failed,
                done.request_cancelled) == (6, 1, 1, 1)
        assert done.meta == {"legacy_input": "/data/in.jsonl", "legacy_output": "/data/out.jsonl"}
        assert done.completed_at.isoformat() == "2026-11-01T11:00:00+00:00"
        assert batches["b-failed"].errors[0]["message"] == "boom"
        assert batches["b-queued"].in_progress_at == batches["b-queued"].created_at
        # the new shape works on migrated rows
        assert s.transition_batch("b-running", "finalizing")
    downgrade(url, "0001")
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            got = dict(conn.execute(text("SELECT id, status FROM batches")).all())
            inp = conn.execute(text("SELECT input FROM batches WHERE id='b-completed'")).scalar()
            nreq = conn.execute(text("SELECT count(*) FROM requests")).scalar()
    finally:
        engine.dispose()
    assert got == {"b-queued": "running", "b-running": "running", "b-completed": "completed",
                   "b-failed": "failed", "b-cancelled": "cancelled", "b-expired": "expired"}
    assert inp == "/data/in.jsonl" and nreq == 6
