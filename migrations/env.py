"""Alembic environment: target metadata = store.models.Base.metadata.

Run through `store.migrate.upgrade(url)` (or `inflight db upgrade`); the plain
`alembic -c migrations/alembic.ini upgrade head` works too, with INFLIGHT_DATABASE_URL
or sqlalchemy.url set.
"""

from __future__ import annotations

import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy import create_engine, pool

from inflight.store.models import Base

config = context.config
if config.config_file_name is not None and not config.attributes.get("programmatic"):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url") or os.environ.get("INFLIGHT_DATABASE_URL")
    if not url:
        raise RuntimeError("no database URL: set INFLIGHT_DATABASE_URL or sqlalchemy.url")
    if url.startswith(("postgres://", "postgresql://")):
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True,
                      render_as_batch=_url().startswith("sqlite"))
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = create_engine(_url(), poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            context.configure(connection=connection, target_metadata=target_metadata,
                              render_as_batch=connection.dialect.name == "sqlite")
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
