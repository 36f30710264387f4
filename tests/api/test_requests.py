"""Single requests over plain HTTP, end to end: submit, poll, SSE, cancel, duplicates."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import httpx
import orjson
import pytest

pytestmark = [pytest.mark.broker]


def sse_events(resp: httpx.Response) -> Iterator[tuple[str | None, dict]]:
    """(event name, data) of each SSE frame."""
    name, data = None, []
    for line in resp.iter_lines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            data.append(line[6:])
        elif line == "" and data:
            yield name, orjson.loads("\n".join(data))
            name, data = None, []


def poll(http: httpx.Client, rid: str, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        body = http.get(f"/v1/requests/{rid}").json()
        if body["status"] not in ("queued", "running") or time.monotonic() > deadline:
            return body
        time.sleep(0.05)


def test_submit_poll_stream_match_the_engine(stack):
    from engine import Engine, EngineConfig
    from engine import SamplingParams as EP

    key = stack.new_key()
    prompts = ["the quick brown fox", "hello world again", "one two three four"]
    with stack.http(key) as http:
        accepted = [http.post("/v1/requests", json={"prompt": p, "params": {
            "max_tokens": 12, "temperature": 0}}) for p in prompts]
        assert [a.status_code for a in accepted] == [202] * 3
        assert all(a.json()["status"] == "queued" for a in accepted)
        ids = [a.json()["id"] for a in accepted]
        with http.stream("GET", f"/v1/requests/{ids[0]}/events") as resp:
            assert resp.headers["content-type"].startswith("text/event-stream")
            events = list(sse_events(resp))
        done = [poll(http, rid) for rid in ids]
        # a stream opened after the request finished still gets the whole answer
        with http.stream("GET", f"/v1/requests/{ids[1]}/events") as resp:
            late = list(sse_events(resp))
    engine = Engine(EngineConfig(model=str(stack.model), num_kv_blocks=128, max_num_seqs=4))
    ref = engine.generate(prompts, EP(max_tokens=12, temperature=0.0))
    for body, out in zip(done, ref):
        assert body["status"] == "completed" and body["finish_reason"] in ("stop", "length")
        assert body["token_ids"] == out.token_ids and body["text"] == out.text
        assert body["usage"]["completion_tokens"] == len(out.token_ids)
        assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + len(out.token_ids)
        assert body["timings"]["finished_at"] >= body["created_at"]
    names = [n for n, _ in events]
    assert names[-1] == "final" and set(names[:-1]) <= {"token", "status"}
    streamed = "".join(d["text"] for n, d in events if n == "token")
    assert streamed == events[-1][1]["text"] == done[0]["text"]
    assert [n for n, _ in late] == ["final"] and late[0][1]["token_ids"] == done[1]["token_ids"]


def test_cancel_a_running_request(stack):
    key = stack.new_key()
    with stack.http(key) as http:
        warm = http.post("/v1/requests", json={"prompt": "warm", "params": {"max_tokens": 1}})
        http.delete(f"/v1/requests/{warm.json()['id']}")  # the workers' cancel readers are live
        rid = http.post("/v1/requests", json={"prompt": "hello world", "params": {
            "max_tokens": 480, "ignore_eos": True, "temperature": 0}}).json()["id"]
        with http.stream("GET", f"/v1/requests/{rid}/events") as resp:
            events = sse_events(resp)
            for name, _ in events:
                if name == "token":
                    break
            cancel = http.delete(f"/v1/requests/{rid}")
            assert cancel.status_code == 202 and cancel.json()["id"] == rid
            rest = list(events)
        assert rest[-1][0] == "final" and rest[-1][1]["finish_reason"] == "abort"
        body = poll(http, rid)
        assert body["status"] == "cancelled" and len(body["token_ids"] or []) < 480
        again = http.delete(f"/v1/requests/{rid}")
        assert again.status_code == 200 and again.json()["status"] == "cancelled"


def test_same_request_id_is_one_request(stack):
    key = stack.new_key()
    rid = f"idem-{uuid.uuid4().hex[:8]}"
    body = {"request_id": rid, "prompt": "red green blue", "params": {"max_tokens": 5,
                                                                      "temperature": 0}}
    with stack.http(key) as http:
        first = http.post("/v1/requests", json=body)
        second = http.post("/v1/requests", json={**body, "prompt": "something else"})
        assert first.status_code == second.status_code == 202
        assert first.json()["id"] == second.json()["id"] == rid
        done = poll(http, rid)
        third = http.post("/v1/requests", json=body)
    assert done["status"] == "completed"
    assert third.status_code == 202 and third.json()["status"] == "completed"
    row = stack.store.get_request(rid)
    assert row.prompt == "red green blue" and row.owner == key.info.owner


def test_bad_input_the_worker_refuses_ends_failed(stack):
    key = stack.new_key()
    with stack.http(key) as http:  # longer than the tiny model's 512-token context
        rid = http.post("/v1/requests", json={"prompt_token_ids": [5] * 600,
                                              "params": {"max_tokens": 4}}).json()["id"]
        body = poll(http, rid)
        with http.stream("GET", f"/v1/requests/{rid}/events") as resp:
            events = list(sse_events(resp))
    assert body["status"] == "failed" and body["error"]["code"] == "prompt_too_long"
    assert events == [("error", {"type": "error", "request_id": rid, "code": "prompt_too_long",
                                 "message": body["error"]["message"], "worker": body["worker"],
                                 "batch_id": None})]
