"""Database URLs: the one spelling we accept for Postgres and a printable form (no
password). Apart from store.queries so that store.migrate can use them without
importing the query layer (which imports store.migrate to create a SQLite file)."""

from __future__ import annotations

from sqlalchemy.engine import make_url


def normalize_url(url: str) -> str:
    """`postgres://` and `postgresql://` mean psycopg 3 here (psycopg2 is not installed)."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


def redact(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 — only used inside error messages
        return "<unparseable URL>"
