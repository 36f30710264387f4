"""Shared fixtures. Each block below belongs to one area; keep them separate."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest


# ==== Postgres (store) ==================================================================
# `postgres_url`: a fresh, uniquely named database on 127.0.0.1:5432 for the whole test
# session, dropped at the end. Skips when Postgres is unreachable — except with
# INFLIGHT_TEST_POSTGRES=required (CI), where that is a failure.
# Override the server with INFLIGHT_TEST_POSTGRES_URL (any database on it; the fixture
# creates its own next to it).

PG_DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


def _pg_unavailable(reason: str) -> None:
    if os.environ.get("INFLIGHT_TEST_POSTGRES", "").lower() == "required":
        pytest.fail(f"Postgres is required (INFLIGHT_TEST_POSTGRES=required) but {reason}",
                    pytrace=False)
    pytest.skip(f"Postgres not available: {reason}")


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    from sqlalchemy.engine import make_url

    from tests.pgdb import temporary_database

    base = os.environ.get("INFLIGHT_TEST_POSTGRES_URL", PG_DEFAULT_URL)
    if base.startswith(("postgres://", "postgresql://")):
        base = "postgresql+psycopg://" + base.split("://", 1)[1]
    with contextlib.ExitStack() as stack:
        try:
            url = stack.enter_context(temporary_database(base, "inflight_test_"))
        except Exception as e:  # noqa: BLE001 — any failure to reach/create means "no Postgres"
            admin_url = make_url(base).set(database="postgres").render_as_string()
            _pg_unavailable(f"cannot create a test database via {admin_url}: "
                            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        yield url


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path) -> str:
    """A database URL per backend: a fresh SQLite file, or the session's Postgres database
    (shared by tests: use unique ids, or the `store` fixture of tests/store)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'inflight.db'}"
    return request.getfixturevalue("postgres_url")

# ==== end Postgres ======================================================================


# ==== Embedded broker ===================================================================
# `broker`: one Tansu process per test session on a free port (memory storage).
# `kafka_settings`: Settings pointed at it, with topic names unique to the test, so tests
# sharing the broker never see each other's messages; the topics are created up front.


@pytest.fixture(scope="session")
def broker(tmp_path_factory):
    from inflight.cli.broker import EmbeddedBroker

    b = EmbeddedBroker(log_path=tmp_path_factory.mktemp("broker") / "tansu.log")
    b.start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def kafka_settings(broker, tmp_path):
    from tests.kafka_settings import make_settings

    return make_settings(broker, f"sqlite:///{tmp_path / 'inflight.db'}",
                         cache_dir=tmp_path / "cache", data_dir=tmp_path / "data")

# ==== end embedded broker ===============================================================


# ==== Tiny model ========================================================================
# `tiny_model`: the default tiny random Llama (tests/tiny_llama.py, seed 0), written once per
# session for every package that runs the service path (consumers, api). Read-only.


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    from tests.tiny_llama import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_model_b(tmp_path_factory):
    """A second, different model for the tests of several models at once: a tiny random
    Gemma 3 (tests/tiny_families.py) with a context of 256 (tiny_model's is 512)."""
    from tests.tiny_families import write_tiny_family

    return write_tiny_family(tmp_path_factory.mktemp("tiny-gemma3"), "gemma3",
                             max_position_embeddings=256)

# ==== end tiny model ====================================================================
