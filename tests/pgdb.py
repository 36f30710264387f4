"""A throwaway Postgres database for tests: created next to a given URL, dropped after."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url


@contextlib.contextmanager
def temporary_database(server_url: str, prefix: str) -> Iterator[str]:
    """Yield the URL of a fresh database `<prefix><hex>` on `server_url`'s server; it is
    dropped (connections forced off) on exit. Creation errors propagate to the caller."""
    name = f"{prefix}{uuid.uuid4().hex[:12]}"
    admin = create_engine(make_url(server_url).set(database="postgres"),
                          isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 5})
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()
