"""The real API (uvicorn on a free port) in front of the real path: embedded broker, a
worker on the tiny random Llama, the recorder, SQLite or Postgres. One stack per backend
serves every test of the package that asks for it (`stack`); tests keep apart by using
their own keys (each key is its own owner) and ids."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from schemas import Settings
from tests.api.server import ApiServer
from tests.consumers.conftest import Service, make_settings, migrated, tiny_engine


@pytest.fixture(scope="session")
def api_model(tmp_path_factory) -> Path:
    from tests.tiny_llama import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("api-tiny-llama"))


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
        from api.keys import create_key

        return create_key(self.store, name, owner=owner)

    def http(self, key=None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key.token}"} if key is not None else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)


def _database(request, tmp_path_factory) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path_factory.mktemp('api-db') / 'inflight.db'}"
    return migrated(request.getfixturevalue("postgres_url"))


@pytest.fixture(scope="session", params=["sqlite", "postgres"])
def stack(request, broker, api_model, tmp_path_factory):
    """API + worker + recorder on one backend (keys re-checked on every request, so a
    revocation shows at once)."""
    settings = make_settings(broker, _database(request, tmp_path_factory),
                             api_key_cache_s=0.0, api_wait_timeout_s=60.0)
    service = Service(settings, tiny_engine(api_model))
    try:
        with ApiServer(settings) as api:
            yield Stack(settings, api, service, api_model)
    finally:
        service.stop()


@pytest.fixture(scope="session")
def bare(broker, tmp_path_factory):
    """API alone (SQLite, no worker): errors, limits, auth, validation."""
    url = f"sqlite:///{tmp_path_factory.mktemp('api-bare') / 'inflight.db'}"
    settings = make_settings(broker, url, api_key_cache_s=0.0, api_max_body_bytes=20_000,
                             api_max_upload_bytes=200_000, api_max_upload_lines=50,
                             api_max_line_bytes=2_000)
    with ApiServer(settings) as api:
        yield Stack(settings, api, None, Path())
