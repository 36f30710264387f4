"""A broker outage is answered fast: once the API knows the broker is away, a submit is a
503 within a bound with a Retry-After that grows; /readyz says not ready while /healthz
stays live; when the broker is back, submits go through again. (And links the API hands
out come from INFLIGHT_API_PUBLIC_URL, never from the request's Host header.)"""

from __future__ import annotations

import time

import httpx
import pytest

from inflight.cli.broker import EmbeddedBroker, free_port
from inflight.schemas import Settings
from tests.api.server import ApiServer

pytestmark = [pytest.mark.broker]


def _settings(tmp_path, port: int) -> Settings:
    return Settings(kafka_bootstrap=f"127.0.0.1:{port}", database_url=f"sqlite:///{tmp_path / 'db'}",
                    data_dir=tmp_path / "data", cache_dir=tmp_path / "cache",
                    api_key_cache_s=0.0, metrics_interval_s=0.0, api_publish_timeout_s=3.0,
                    api_public_url="https://inference.example.com/")


def test_submits_fail_fast_while_the_broker_is_away_and_resume(tmp_path):
    from inflight.api.keys import create_key
    from inflight.cli.topics import create_topics

    port = free_port()
    settings = _settings(tmp_path, port)
    with ApiServer(settings) as api:
        key = create_key(api.ctx.store, "k")
        http = httpx.Client(base_url=api.url, timeout=30,
                            headers={"Authorization": f"Bearer {key.token}"})
        body = {"prompt": "hi", "params": {"max_tokens": 2}}
        waits = []
        for _ in range(3):
            t0 = time.monotonic()
            resp = http.post("/v1/requests", json=body)
            took = time.monotonic() - t0
            assert resp.status_code == 503, resp.text
            assert resp.json()["error"]["code"] == "broker_unavailable" and took < 2.0, took
            waits.append(int(resp.headers["retry-after"]))
            time.sleep(waits[-1] + 1.6)  # a probe runs and fails (bounded at 1.5 s)
        assert waits[-1] > waits[0], waits  # it grows while the broker stays away
        ready = http.get("/readyz")
        assert ready.status_code == 503 and ready.json() == {
            "status": "not_ready", "broker": "unreachable", "store": "ok"}
        assert http.get("/healthz").json()["status"] == "ok"  # alive all along
        # links the API hands out: under the configured public URL, whatever Host says
        made = http.post("/v1/messages/batches", headers={"Host": "evil.example"}, json={
            "requests": [{"custom_id": "a", "params": {"model": "default", "max_tokens": 2, "messages": [
                {"role": "user", "content": "hi"}]}}]})
        assert made.status_code == 200, made.text
        api.ctx.store.transition_batch(made.json()["id"], "expired")
        api.ctx.store.set_batch_fields(made.json()["id"], output_file_id="file-x")
        got = http.get(f"/v1/messages/batches/{made.json()['id']}").json()
        assert got["results_url"] == ("https://inference.example.com/v1/messages/batches/"
                                      f"{made.json()['id']}/results")
        with EmbeddedBroker(port=port):
            create_topics(settings, partitions=1)
            deadline = time.monotonic() + 60
            while http.get("/readyz").status_code != 200:
                assert time.monotonic() < deadline, "the API never saw the broker come back"
                time.sleep(0.5)
            assert http.post("/v1/requests", json=body).status_code == 202
            assert http.get("/readyz").json() == {"status": "ready", "broker": "ok", "store": "ok"}
        http.close()
