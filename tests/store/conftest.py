from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from store import Store


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    """A migrated Store with empty tables (SQLite: a fresh file; Postgres: truncated)."""
    s = Store(db_url, create=True)
    if s.dialect == "postgresql":
        with s.engine.begin() as conn:
            conn.execute(text("TRUNCATE requests, batches"))
    yield s
    s.close()


@pytest.fixture
def empty_db_url(db_url: str) -> Iterator[str]:
    """A database with nothing in it (Postgres: another fresh database, dropped after)."""
    if not db_url.startswith("postgresql"):
        yield db_url
        return
    name = f"inflight_empty_{uuid.uuid4().hex[:10]}"
    admin = create_engine(make_url(db_url).set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(db_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
