"""Single requests over plain HTTP, end to end: submit, poll, SSE, cancel, duplicates."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

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
        resp = http.get(f"/v1/requests/{rid}")
        assert resp.status_code == 200, resp.text
        body = resp.json()
        if body["status"] not in ("queued", "running") or time.monotonic() > deadline:
            return body
        time.sleep(0.05)


def test_submit_poll_stream_match_the_engine(stack):
    from inflight.engine import Engine, EngineConfig
    from inflight.engine import SamplingParams as EP

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
        assert body["status"] == "completed" and body["finish_reason"] in ("stop", "length"), body
        assert (body["token_ids"], body["text"]) == (out.token_ids, out.text), body
        assert body["usage"]["completion_tokens"] == len(out.token_ids)
        assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + len(out.token_ids)
        assert body["timings"]["finished_at"] >= body["created_at"]
    names = [n for n, _ in events]
    assert names[-1] == "final" and set(names[:-1]) == {"token"}, events
    assert streamed_text(events) == events[-1][1]["text"] == done[0]["text"]
    # finished before the stream opened: the whole text in one delta, then the final
    assert [n for n, _ in late] == ["token", "final"]
    assert late[0][1]["token_ids"] == late[1][1]["token_ids"] == done[1]["token_ids"]
    assert streamed_text(late) == done[1]["text"]


def streamed_text(events: list[tuple[str | None, dict]]) -> str:
    """The text a reader builds from the deltas (an index-0 delta starts it over)."""
    text = ""
    for name, data in events:
        if name == "token":
            text = (text if data["index"] else "") + data["text"]
    return text


def test_cancel(stack):
    """Six long requests, submitted at once and cancelled at once.

    NOTE: the worker takes all six as soon as they are published, so these cancel running
    requests. Everything is sent concurrently (the submits share one group commit) so the
    cancels land within a few steps of the start: one at a time, on a Postgres whose
    commits were slow under load, the first request had finished its 480 tokens before its
    DELETE (a 200, not a 202). A request that did finish first is allowed, not required."""
    key = stack.new_key()
    long = {"prompt": "hello world", "params": {"max_tokens": 480, "ignore_eos": True,
                                                "temperature": 0}}
    with stack.http(key) as http, ThreadPoolExecutor(6) as pool:
        accepted = list(pool.map(lambda _: http.post("/v1/requests", json=long), range(6)))
        assert [a.status_code for a in accepted] == [202] * 6
        ids = [a.json()["id"] for a in accepted]
        cancels = list(pool.map(lambda rid: http.delete(f"/v1/requests/{rid}"), ids))
        done = {rid: poll(http, rid) for rid in ids}
        with http.stream("GET", f"/v1/requests/{ids[-1]}/events") as resp:
            events = list(sse_events(resp))
        again = http.delete(f"/v1/requests/{ids[-1]}")
    for rid, cancel in zip(ids, cancels):
        assert cancel.json()["id"] == rid
        # 202: cancel sent; 200: it had already finished (the body says how)
        assert cancel.status_code == 202 or (cancel.status_code == 200 and cancel.json()[
            "status"] == done[rid]["status"] == "completed"), (cancel.status_code, cancel.text)
    statuses = {rid: (d["status"], len(d["token_ids"] or [])) for rid, d in done.items()}
    assert all(st == "cancelled" and n < 480 or st == "completed" and n == 480
               for st, n in statuses.values()), statuses
    assert any(st == "cancelled" for st, _ in statuses.values()), statuses
    final = done[ids[-1]]
    last = events[-1]
    if final["status"] == "cancelled":
        assert (last[0], last[1].get("finish_reason", last[1].get("code"))) in (
            ("final", "abort"), ("error", "cancelled"))
    else:
        assert last[0] == "final" and last[1]["token_ids"] == final["token_ids"]
    assert again.status_code == 200 and again.json()["status"] == final["status"]


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


def test_reply_to_over_http(stack):
    """POST /v1/requests with `reply_to`: the final also lands on that topic of the caller's
    (the Kafka contract's reply_to, docs/kafka-contract.md); a topic of inflight's own, or a
    name that is no topic name, is a 400 naming reply_to before anything is sent; one that
    does not exist ends failed at intake (reply_to_refused), as over Kafka."""
    import json

    from tests.consumers.conftest import create_topic, read_topic

    s = stack.settings
    reply = f"replies-{uuid.uuid4().hex[:6]}"
    create_topic(s, reply)
    key = stack.new_key()
    with stack.http(key) as http:
        # not a topic name at all: the schema refuses it (as on the wire: invalid_request)
        for bad, why in ((s.topic_results, "inflight's own topics"), ("bad!topic", "should match pattern")):
            r = http.post("/v1/requests", json={"prompt": "x", "reply_to": bad})
            assert r.status_code == 400 and why in r.text, r.text
            assert r.json()["error"]["param"] == "reply_to"
        ok = http.post("/v1/requests", json={"prompt": "one two", "reply_to": reply,
                                             "params": {"max_tokens": 4, "temperature": 0}})
        missing = http.post("/v1/requests", json={"prompt": "x", "reply_to": f"nowhere-{uuid.uuid4().hex[:6]}"})
        assert ok.status_code == missing.status_code == 202, (ok.text, missing.text)
        done = poll(http, ok.json()["id"])
        gone = poll(http, missing.json()["id"])
    assert done["status"] == "completed"
    assert gone["status"] == "failed" and "does not exist" in json.dumps(gone), gone
    recs = read_topic(s, reply, until=lambda rs: any(b'"type":"final"' in r.value for r in rs))
    finals = [json.loads(r.value) for r in recs if b'"type":"final"' in r.value]
    assert [f["request_id"] for f in finals] == [done["id"]] and finals[0]["text"] == done["text"]
