"""Limits per API key, counted in the database two API processes share (SQLite and
Postgres): 429 with Retry-After and OpenAI's x-ratelimit-* headers, the official openai SDK
waiting Retry-After between its retries, the tenant set from the key's owner, and usage."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest

from tests.api.conftest import _database
from tests.api.server import ApiServer
from tests.consumers.conftest import make_settings

pytestmark = [pytest.mark.broker]


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def two_apis(request, broker, tmp_path_factory):
    """Two API apps (two processes' worth: each its own key cache and store pool) on one
    database, no worker: what they file stays queued."""
    with _database(request, tmp_path_factory) as database:
        settings = make_settings(broker, database, api_key_cache_s=0.0)
        with ApiServer(settings) as a, ApiServer(settings) as b:
            yield a, b


def _key(api, **limits):
    from inflight.api.keys import create_key

    return create_key(api.ctx.store, "limited", owner=f"team-{uuid.uuid4().hex[:8]}", **limits)


def _post(url: str, key, **body) -> httpx.Response:
    payload = {"prompt": "hello world", "params": {"max_tokens": 4}, **body}
    return httpx.post(f"{url}/v1/requests", headers={"Authorization": f"Bearer {key.token}"},
                      json={k: v for k, v in payload.items() if v is not None}, timeout=30)


def test_requests_per_minute_are_shared_by_two_api_processes(two_apis):
    a, b = two_apis
    key = _key(a, rpm=3)
    seen = []
    for api in (a, b, a):
        r = _post(api.url, key)
        assert r.status_code == 202, r.text
        seen.append(int(r.headers["x-ratelimit-remaining-requests"]))
        assert r.headers["x-ratelimit-limit-requests"] == "3"
        assert r.json()["tenant"] == key.info.owner  # the tenant is the key's owner
    assert seen == [2, 1, 0]
    r = _post(b.url, key)  # the fourth, on the other process: over the shared limit
    assert r.status_code == 429
    assert r.json()["error"]["type"] == "rate_limit_error"
    assert 1 <= int(r.headers["retry-after"]) <= 60
    assert r.headers["x-ratelimit-remaining-requests"] == "0"
    assert r.headers["x-ratelimit-reset-requests"].endswith("s")
    # every answer to the key carries the headers, a poll too
    got = httpx.get(f"{a.url}/v1/requests/nope", timeout=30,
                    headers={"Authorization": f"Bearer {key.token}"})
    assert got.status_code == 404 and got.headers["x-ratelimit-remaining-requests"] == "0"


def test_tokens_per_minute_reserve_prompt_and_max_tokens(two_apis):
    a, b = two_apis
    key = _key(a, tpm=100)
    r = _post(a.url, key, prompt_token_ids=list(range(10)), prompt=None,
              params={"max_tokens": 50})
    assert r.status_code == 202, r.text
    assert r.headers["x-ratelimit-remaining-tokens"] == "40"
    r = _post(b.url, key, prompt_token_ids=list(range(10)), prompt=None,
              params={"max_tokens": 50})
    assert r.status_code == 429 and "tokens per minute" in r.json()["error"]["message"]
    r = _post(b.url, key, params={"max_tokens": 500})
    assert r.status_code == 429 and r.json()["error"]["code"] == "tokens_exceed_limit"


def test_the_openai_sdk_waits_retry_after_between_retries(two_apis):
    import openai

    a, b = two_apis
    key = _key(a, max_concurrent=1)
    assert _post(a.url, key).status_code == 202  # stays queued (no worker): 1 in flight
    times: list[float] = []
    http = httpx.Client(event_hooks={"response": [lambda r: times.append(time.monotonic())]})
    client = openai.OpenAI(base_url=f"{b.url}/v1", api_key=key.token, max_retries=2,
                           http_client=http)
    with pytest.raises(openai.RateLimitError) as exc:
        client.completions.create(model="default", prompt="hi", max_tokens=4)
    assert exc.value.response.headers["retry-after"] == "1"
    assert len(times) == 3  # the first try and two retries
    # Retry-After: 1 honoured (the SDK's own backoff would wait ~0.5 s, then ~1 s)
    assert all(t2 - t1 >= 0.95 for t1, t2 in zip(times, times[1:])), times


def test_a_key_without_limits_gets_no_ratelimit_headers(two_apis):
    a, _ = two_apis
    from inflight.api.keys import create_key

    key = create_key(a.ctx.store, "free")
    r = _post(a.url, key)
    assert r.status_code == 202 and "x-ratelimit-limit-requests" not in r.headers


def test_usage_is_scoped_to_the_owner_and_admin_sees_all(two_apis):
    from inflight.api.keys import create_key
    from inflight.schemas.events import FinalEvent, Timings, Usage
    from inflight.store import final_row

    a, _ = two_apis
    store = a.ctx.store
    key = _key(a)
    r = _post(a.url, key)
    rid = r.json()["id"]
    store.upsert_requests([final_row(FinalEvent(request_id=rid, text="hi", finish_reason="stop",
                                                usage=Usage(prompt_tokens=7, completion_tokens=3),
                                                timings=Timings(finished_at=time.time())))])
    auth = {"Authorization": f"Bearer {key.token}"}
    mine = httpx.get(f"{a.url}/v1/usage", headers=auth, timeout=30).json()["data"]
    assert [(u["owner"], u["prompt_tokens"], u["completion_tokens"]) for u in mine] == [
        (key.info.owner, 7, 3)]
    assert httpx.get(f"{a.url}/v1/usage?owner=someone-else", headers=auth,
                     timeout=30).status_code == 403
    admin = create_key(store, "admin", admin=True)
    every = httpx.get(f"{a.url}/v1/usage", timeout=30,
                      headers={"Authorization": f"Bearer {admin.token}"}).json()["data"]
    assert key.info.owner in {u["owner"] for u in every}
