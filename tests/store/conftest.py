from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import text

from inflight.store import Store
from tests.pgdb import temporary_database


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    """A migrated Store with empty tables (SQLite: a fresh file; Postgres: truncated)."""
    s = Store(db_url, create=True)
    if s.dialect == "postgresql":
        with s.engine.begin() as conn:
            conn.execute(text("TRUNCATE requests, batches, files, file_chunks"))
    yield s
    s.close()


@pytest.fixture
def empty_db_url(db_url: str) -> Iterator[str]:
    """A database with nothing in it (Postgres: another fresh database, dropped after)."""
    if not db_url.startswith("postgresql"):
        yield db_url
        return
    with temporary_database(db_url, "inflight_empty_") as url:
        yield url
