"""Alembic: upgrade from an empty database, on SQLite and Postgres."""

from __future__ import annotations

import os

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from store import Store, upgrade
from store.migrate import current_revision, downgrade, head_revision
from store.models import Base


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
    assert "ix_batches_status" in tables["batches"]
    assert current_revision(url) == head_revision() == "0001"
    upgrade(url)  # a second upgrade is a no-op
    assert current_revision(url) == "0001"


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
