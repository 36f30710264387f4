"""The real API (uvicorn on a free port) in front of the real path: embedded broker, a
worker on the tiny random Llama, the recorder, SQLite or Postgres. One stack per backend
serves every test of the package that asks for it (`stack`); tests keep apart by using
their own keys (each key is its own owner) and ids."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from inflight.schemas import Settings
from tests.api.server import ApiServer
from tests.consumers.conftest import Service, make_settings, migrated, tiny_engine
from tests.pgdb import temporary_database


@dataclass
class Stack:
    settings: Settings
    api: ApiServer
    service: Service | None
    model: Path

    @property
    def url(self) -> str:
        return self.api.url

    @property
    def store(self):
        return self.api.ctx.store

    def new_key(self, name: str = "test", owner: str | None = None):
        from inflight.api.keys import create_key

        return create_key(self.store, name, owner=owner)

    def http(self, key=None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key.token}"} if key is not None else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)


@contextlib.contextmanager
def _database(request, tmp_path_factory) -> Iterator[str]:
    """A migrated database of the stack's own (before any process opens it: two processes
    migrating one SQLite file at once would race).

    NOTE: not the session's shared Postgres database: the stack's Celery worker sweeps every
    batch it can see, and would finish other tests' batches under them."""
    if request.param == "sqlite":
        yield migrated(f"sqlite:///{tmp_path_factory.mktemp('api-db') / 'inflight.db'}")
        return
    with temporary_database(request.getfixturevalue("postgres_url"), "inflight_api_") as url:
        yield migrated(url)


@pytest.fixture(scope="session", params=["sqlite", "postgres"])
def stack(request, broker, tiny_model, tmp_path_factory):
    """API + worker + recorder + a Celery worker (`inflight jobs`: embedded filesystem
    transport with SQLite, Redis with Postgres) on one backend. Keys are re-checked on
    every request, so a revocation shows at once."""
    from tests.producers.test_batch_e2e import _redis_or_skip

    tmp = tmp_path_factory.mktemp("api-stack")
    celery_broker = None if request.param == "sqlite" else _redis_or_skip()
    with _database(request, tmp_path_factory) as database:
        yield from _stack(broker, tiny_model, tmp, database, celery_broker)


def _stack(broker, tiny_model, tmp, database, celery_broker):
    from tests.producers.test_batch_e2e import JobsProcess

    settings = make_settings(broker, database,
                             api_key_cache_s=0.0, api_wait_timeout_s=60.0,
                             data_dir=tmp / "data", cache_dir=tmp / "cache",
                             model_path=str(tiny_model), served_model_name="tiny",
                             celery_broker=celery_broker,
                             celery_queue=f"q-{uuid.uuid4().hex[:8]}",
                             batch_sweep_interval_s=0.3, batch_lease_s=2.0,
                             webhook_allow_hosts="127.0.0.1", webhook_interval_s=0.3,
                             webhook_retry_base_s=0.3, webhook_retry_max_s=1.0)
    jobs = JobsProcess(settings, tmp / "jobs.log")  # starts while the worker joins its group
    service = Service(settings, tiny_engine(tiny_model))
    try:
        jobs.wait_ready()
        with ApiServer(settings) as api:
            yield Stack(settings, api, service, tiny_model)
    finally:
        jobs.stop()
        service.stop()
        if celery_broker:
            import redis

            redis.Redis.from_url(celery_broker).delete(settings.celery_queue)


@pytest.fixture(scope="session")
def bare(broker, tmp_path_factory):
    """API alone (SQLite, no worker): errors, limits, auth, validation."""
    url = f"sqlite:///{tmp_path_factory.mktemp('api-bare') / 'inflight.db'}"
    settings = make_settings(broker, url, api_key_cache_s=0.0, api_max_body_bytes=20_000,
                             api_max_upload_bytes=200_000, api_max_upload_lines=50,
                             api_max_line_bytes=2_000)
    with ApiServer(settings) as api:
        yield Stack(settings, api, None, Path())


KEEPALIVE_S = 1.0
SLOTS = 8


@pytest.fixture(scope="session")
def queued(broker, tmp_path_factory):
    """API + worker + recorder (SQLite) where requests wait in the queue: a worker of
    SLOTS sequences, a keep-alive every KEEPALIVE_S, and a tiny random Llama with a 2,048
    token context (room for the tool and schema prompts instructor writes)."""
    from tests.tiny_llama import write_tiny_llama

    tmp = tmp_path_factory.mktemp("api-queued")
    model = write_tiny_llama(tmp / "tiny-2k", max_position_embeddings=2048)
    database = migrated(f"sqlite:///{tmp / 'inflight.db'}")
    settings = make_settings(broker, database, api_key_cache_s=0.0, api_wait_timeout_s=300.0,
                             api_keepalive_s=KEEPALIVE_S, data_dir=tmp / "data",
                             cache_dir=tmp / "cache", model_path=str(model),
                             served_model_name="tiny")
    service = Service(settings, tiny_engine(model, max_num_seqs=SLOTS, num_kv_blocks=1024))
    try:
        with ApiServer(settings) as api:
            yield Stack(settings, api, service, model)
    finally:
        service.stop()
