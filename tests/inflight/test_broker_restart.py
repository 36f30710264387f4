"""The embedded broker on durable storage (Tansu's s3:// engine against a local S3 server,
moto's server mode) is restarted mid-run: the worker, the recorder, the producer client and
the API reconnect, and every request ends with exactly one completed row. Real engine (tiny
model), SQLite."""

from __future__ import annotations

import time

import pytest

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def test_a_durable_broker_restarted_mid_run_loses_nothing(tiny_model, tmp_path, request):
    pytest.importorskip("moto", reason='the local S3 server needs "moto[server]"')
    import httpx

    from inflight.cli.broker import EmbeddedBroker, free_port
    from inflight.cli.broker_storage import LocalS3
    from inflight.producers.client import Client
    from inflight.schemas import SamplingParams
    from inflight.store import Store
    from tests.api.server import ApiServer
    from tests.consumers.conftest import Service, make_settings, slowed_engine, wait_rows

    s3 = LocalS3(free_port(), log_path=tmp_path / "s3.log").start()
    request.addfinalizer(s3.stop)
    port = free_port()

    def broker_up() -> EmbeddedBroker:
        b = EmbeddedBroker(port=port, log_path=tmp_path / "tansu.log", storage=s3.storage())
        request.addfinalizer(b.stop)
        return b.start()

    broker = broker_up()
    url = f"sqlite:///{tmp_path / 'inflight.db'}"
    store = Store(url, create=True)
    settings = make_settings(broker, url, partitions=2, worker_max_inflight=8, api_auth=False,
                             api_wait_timeout_s=120.0)
    svc = Service(settings, slowed_engine(tiny_model, 0.005, max_num_seqs=8), store)
    client = Client(settings, store=store)
    api = ApiServer(settings).__enter__()
    try:
        params = SamplingParams(max_tokens=150, ignore_eos=True, temperature=0)
        before = client.submit_many([f"one two three {i}" for i in range(10)], params,
                                    progress=False)
        deadline = time.monotonic() + 120
        while svc.worker.metrics["completed"] < 3:      # some done, some running, some queued
            assert time.monotonic() < deadline, svc.worker.metrics.summary()
            time.sleep(0.05)
        broker.stop()
        time.sleep(1.0)                                  # every client sees it gone
        broker = broker_up()
        after = client.submit_many([f"red green {i}" for i in range(4)], params,
                                   progress=False)
        with httpx.Client(base_url=api.url, timeout=60) as http:
            resp = http.post("/v1/requests", json={"prompt": "blue yellow",
                                                   "params": {"max_tokens": 4}})
            assert resp.status_code == 202, resp.text
            via_api = resp.json()["id"]
            ids = before + after + [via_api]
            rows = wait_rows(store, ids, timeout=240)
            assert len(rows) == len(ids)
            assert {r.status for r in rows.values()} == {"completed"}, {
                i: r.status for i, r in rows.items() if r.status != "completed"}
            assert all(rows[i].usage["completion_tokens"] == 150 for i in before + after)
            got = http.get(f"/v1/requests/{via_api}")
            assert got.status_code == 200 and got.json()["status"] == "completed", got.text
    finally:
        api.__exit__(None, None, None)
        svc.stop()
        client.close()
        store.close()
