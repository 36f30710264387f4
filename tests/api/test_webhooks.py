"""Webhooks end to end: registered over HTTP, a batch run through the API with the
official openai SDK, its `batch.completed` event delivered by the Celery jobs worker (the
stack's `inflight jobs` process), signed and verified with `client.webhooks.unwrap` and
`standardwebhooks`; the same event on the batch-events topic keyed by the batch id; a
receiver that fails three times gets it again each time, the attempts listed over HTTP."""

from __future__ import annotations

import time

import orjson
import pytest

from tests.api.test_batches import CHAT, jsonl, line, wait_batch
from tests.api.test_chat import sdk
from tests.consumers.conftest import read_topic
from tests.producers.test_webhooks import Receiver, verify_both

pytestmark = [pytest.mark.broker]


def test_batch_completed_webhook_through_the_jobs_worker(stack):
    key = stack.new_key()
    http, client = stack.http(key), sdk(stack, key)
    ok, flaky = Receiver(), Receiver([500, 500, 500])
    try:
        refused = http.post("/v1/webhooks", json={"url": "http://example.com/x"})
        assert refused.status_code == 400 and "INFLIGHT_WEBHOOK_ALLOW_HOSTS" in refused.text
        meta = http.post("/v1/webhooks", json={"url": "https://169.254.169.254/latest"})
        assert meta.status_code == 400 and "metadata" in meta.text
        made = http.post("/v1/webhooks", json={"url": ok.url, "events": ["batch.completed"]})
        assert made.status_code == 200, made.text
        ep = made.json()
        assert ep["secret"].startswith("whsec_") and ep["status"] == "enabled"
        flaky_ep = http.post("/v1/webhooks", json={"url": flaky.url}).json()
        listed = http.get("/v1/webhooks").json()["data"]
        assert {e["id"] for e in listed} == {ep["id"], flaky_ep["id"]}
        assert all("secret" not in e for e in listed)              # shown once
        assert "secret" not in http.get(f"/v1/webhooks/{ep['id']}").json()
        other = stack.http(stack.new_key("other")).get(f"/v1/webhooks/{ep['id']}")
        assert other.status_code == 404

        upload = client.files.create(file=("w.jsonl", jsonl(
            [line("a", "red green", max_tokens=2, temperature=0)])), purpose="batch")
        batch = client.batches.create(input_file_id=upload.id, endpoint=CHAT,
                                      completion_window="24h")
        assert wait_batch(client, batch.id).status == "completed"
        deadline = time.monotonic() + 60
        while not ok.got or len(flaky.got) < 4:
            assert time.monotonic() < deadline, (len(ok.got), len(flaky.got))
            time.sleep(0.1)
        headers, body = ok.got[0]
        event = verify_both(ep["secret"], headers, body)
        assert (event["type"], event["data"]) == ("batch.completed", {"id": batch.id})
        for h, b in flaky.got:
            assert verify_both(flaky_ep["secret"], h, b)["id"] == event["id"]
        attempts = http.get(f"/v1/webhooks/{flaky_ep['id']}/attempts").json()["data"]
        assert [(a["attempt"], a["status_code"], a["ok"]) for a in attempts] == [
            (4, 200, True), (3, 500, False), (2, 500, False), (1, 500, False)]
        assert all(a["latency_ms"] >= 0 and a["event_id"] == event["id"] for a in attempts)
        # the batch-events topic: the same event, keyed by the batch id
        recs = read_topic(stack.settings, stack.settings.topic_batch_events,
                          until=lambda rs: any(r.key == batch.id.encode() for r in rs))
        [rec] = [r for r in recs if r.key == batch.id.encode()]
        assert orjson.loads(rec.value) == event
        assert http.delete(f"/v1/webhooks/{ep['id']}").json()["deleted"] is True
        assert http.get(f"/v1/webhooks/{ep['id']}").status_code == 404
    finally:
        ok.close()
        flaky.close()
