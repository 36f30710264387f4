"""Run the Alembic migrations in code: `upgrade(url)` (what `inflight db upgrade` calls).

The Alembic Config is built here, with `script_location` = the installed `migrations`
package folder, so it works from a wheel and from any working directory.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

# NOTE: Alembic logs each of its autogenerate plugins at INFO when it is first imported
# (seven lines in every service's start-up): not news to anyone running a migration
logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)

from alembic import command  # noqa: E402 - after the logger above
from alembic.config import Config  # noqa: E402
from alembic.runtime.migration import MigrationContext  # noqa: E402
from alembic.script import ScriptDirectory  # noqa: E402
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, OperationalError

from inflight.schemas.errors import StoreError
from inflight.store.urls import normalize_url, redact


def migrations_dir() -> Path:
    # NOTE: located, not imported (store imports only schemas; migrations imports store).
    spec = importlib.util.find_spec("inflight.migrations")
    if spec is None or not spec.submodule_search_locations:
        raise StoreError("the 'inflight.migrations' package is not installed; "
                         "reinstall inflight")
    return Path(list(spec.submodule_search_locations)[0])


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    # '%' is Alembic's interpolation character: escape it in passwords.
    cfg.set_main_option("sqlalchemy.url", normalize_url(url).replace("%", "%%"))
    cfg.attributes["programmatic"] = True
    return cfg


def upgrade(url: str, revision: str = "head", *, quiet: bool = False) -> None:
    """Bring the database at `url` up to `revision` (creates the tables on an empty one).
    `quiet`: Alembic logs warnings only (a service migrating its embedded SQLite on start
    says what it serves in one line, not a dozen of Alembic's)."""
    sqlite_file = make_url(normalize_url(url))
    if sqlite_file.get_backend_name() == "sqlite" and sqlite_file.database not in (None, "", ":memory:"):
        # the embedded default lives under the user's data dir, which may not exist yet
        Path(sqlite_file.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    alembic_log = logging.getLogger("alembic")
    level = alembic_log.level
    if quiet:
        alembic_log.setLevel(max(level, logging.WARNING))
    try:
        command.upgrade(alembic_config(url), revision)
    except (OperationalError, DBAPIError) as e:
        raise StoreError(f"migrating {redact(url)} failed: {e.orig or e}. Check "
                         "INFLIGHT_DATABASE_URL and that the server is up, then run "
                         "`inflight db upgrade` again.") from e
    finally:
        alembic_log.setLevel(level)


def downgrade(url: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(url), revision)


def current_revision(url: str) -> str | None:
    engine = create_engine(normalize_url(url))
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def head_revision() -> str | None:
    return ScriptDirectory(str(migrations_dir())).get_current_head()
