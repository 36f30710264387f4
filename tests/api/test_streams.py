"""Many open streams on one API process (one results reader, no consumer or thread per
stream), and the stream slot released on every path, under load.

The test plays the workers (publishing the requests' events, as in
test_chat_stream_text.py) against the real API and broker: 300 SSE streams open at once
(the old cap was 64) -- read to the end, dropped before any event, dropped mid-stream,
ended by an error final, cancelled -- and none refused; afterwards no stream is open and
the reader follows nothing. A streamed chat completion whose client leaves releases its
slot and cancels its request; a full house answers 503 until a slot frees up.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import orjson
import pytest

from inflight.schemas import ErrorEvent, FinalEvent, TokenEvent
from inflight.schemas.codec import encode
from tests.api.server import ApiServer
from tests.api.test_chat_stream_text import FakeWorkers, filed_request, reader, take
from tests.consumers.conftest import read_topic
from tests.producers.reader_state import followed

pytestmark = [pytest.mark.broker]

N = 300


@pytest.fixture
def workers(bare):
    w = FakeWorkers(bare.settings)
    yield w
    w.close()


def settled(ctx, timeout: float = 30.0) -> tuple[int, int]:
    """(open streams, follows) once both are 0, or at the timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ctx.metrics.open_streams == 0 and followed(ctx.streams.reader) == 0:
            break
        time.sleep(0.05)
    return ctx.metrics.open_streams, followed(ctx.streams.reader)


async def _sse(http: httpx.AsyncClient, rid: str, mode: str, opened: asyncio.Event,
               counter: list[int]) -> tuple[str, list[tuple[str, dict]]]:
    """One SSE reader: 'all' reads to the end, 'none' leaves before any event, 'one'
    leaves after the first."""
    events: list[tuple[str, dict]] = []
    async with http.stream("GET", f"/v1/requests/{rid}/events") as resp:
        assert resp.status_code == 200, await resp.aread()
        counter[0] += 1
        if counter[0] == N:
            opened.set()
        if mode == "none":
            return rid, events
        name = None
        async for line in resp.aiter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                events.append((name, orjson.loads(line[6:])))
                if mode == "one":
                    return rid, events
    return rid, events


def test_hundreds_of_streams_release_every_slot(bare, workers):
    ctx = bare.api.ctx
    key = bare.new_key()
    headers = {"Authorization": f"Bearer {key.token}"}
    modes = ["all"] * 100 + ["none"] * 50 + ["one"] * 50 + ["error"] * 50 + ["cancel"] * 50
    assert len(modes) == N

    async def main() -> list:
        limits = httpx.Limits(max_connections=N + 20, max_keepalive_connections=N + 20)
        async with httpx.AsyncClient(base_url=bare.url, headers=headers, limits=limits,
                                     timeout=60) as http:
            ids = []
            for j in range(N):
                got = await http.post("/v1/requests", json={
                    "prompt": "hi", "request_id": f"many-{key.info.id}-{j}"})
                assert got.status_code == 202, got.text
                ids.append(got.json()["id"])
            opened, counter = asyncio.Event(), [0]
            tasks = [asyncio.create_task(_sse(http, rid, "all" if m in ("error", "cancel")
                                              else m, opened, counter))
                     for rid, m in zip(ids, modes)]
            await asyncio.wait_for(opened.wait(), 60)
            assert ctx.metrics.open_streams >= N - 50   # the 'none' ones may be gone already
            for rid, m in zip(ids, modes):
                if m == "cancel":
                    assert (await http.delete(f"/v1/requests/{rid}")).status_code == 202
            await asyncio.to_thread(publish_all, workers, ids, modes)
            return await asyncio.gather(*tasks)

    results = asyncio.run(main())
    by_mode = dict(zip([rid for rid, _ in results], modes))
    for rid, events in results:
        mode = by_mode[rid]
        if mode == "all":
            assert [n for n, _ in events] == ["token", "token", "final"], events
            assert "".join(d["text"] for n, d in events if n == "token") == f"text of {rid}"
            assert events[-1][1]["text"] == f"text of {rid}"
        elif mode == "none":
            assert events == []
        elif mode == "one":
            assert [n for n, _ in events] == ["token"]
        elif mode == "error":
            assert events[-1][0] == "error" and events[-1][1]["code"] == "engine_error"
        else:
            assert events[-1][0] == "final" and events[-1][1]["finish_reason"] == "abort"
    assert settled(ctx) == (0, 0)


def publish_all(workers: FakeWorkers, ids: list[str], modes: list[str]) -> None:
    s = workers.settings
    for rid, mode in zip(ids, modes):
        if mode == "error":
            workers._send(s.topic_results, ErrorEvent(request_id=rid, attempt="a1",
                                                      code="engine_error", message="boom"))
        elif mode == "cancel":
            workers._send(s.topic_results, FinalEvent(request_id=rid, attempt="a1", text="",
                                                      finish_reason="abort"))
        else:
            workers._send(s.topic_results_tokens, TokenEvent(
                request_id=rid, attempt="a1", index=0, start=0, token_ids=[1], text="text "))
            workers._send(s.topic_results_tokens, TokenEvent(
                request_id=rid, attempt="a1", index=1, start=1, token_ids=[2],
                text=f"of {rid}"))
    workers.producer.flush()
    for rid, mode in zip(ids, modes):   # finals after every delta is out
        if mode in ("all", "none", "one"):
            workers.final(rid, "a1", [1, 2], f"text of {rid}")


def chat_until(bare, key, put, n: int) -> None:
    """A streamed chat completion whose client hangs up after `n` chunks."""
    with bare.http(key) as http, http.stream("POST", "/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "stream": True}) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if line.startswith("data: "):
                put(orjson.loads(line[6:]))
                n -= 1
                if n == 0:
                    return


def test_a_chat_stream_whose_client_leaves_is_released_and_cancelled(bare, workers):
    key = bare.new_key()
    got = reader(lambda put: chat_until(bare, key, put, 2))
    rid = filed_request(bare, key.info.owner)
    workers.tokens(rid, "a1", [([11], "Hel"), ([12], "lo")])
    take(got, 2)    # the role chunk and "Hel"; then the client hangs up
    assert settled(bare.api.ctx) == (0, 0)
    cancels = read_topic(bare.settings, bare.settings.topic_cancel,
                         until=lambda recs: rid.encode() in {r.key for r in recs})
    assert rid.encode() in {r.key for r in cancels}


def test_a_full_house_answers_503_until_a_slot_frees(broker, tmp_path):
    from tests.consumers.conftest import make_settings

    settings = make_settings(broker, f"sqlite:///{tmp_path / 'full.db'}", api_max_streams=2,
                             api_key_cache_s=0.0)
    with ApiServer(settings) as api, httpx.Client(base_url=api.url, timeout=30) as http:
        from inflight.api.keys import create_key

        token = create_key(api.ctx.store, "full").token
        http.headers["Authorization"] = f"Bearer {token}"
        ids = [http.post("/v1/requests", json={"prompt": "hi"}).json()["id"] for _ in range(3)]
        first = http.stream("GET", f"/v1/requests/{ids[0]}/events")
        second = http.stream("GET", f"/v1/requests/{ids[1]}/events")
        assert first.__enter__().status_code == second.__enter__().status_code == 200
        refused = http.get(f"/v1/requests/{ids[2]}/events")
        assert refused.status_code == 503 and refused.headers["retry-after"]
        assert "INFLIGHT_API_MAX_STREAMS" in refused.json()["error"]["message"]
        first.__exit__(None, None, None)
        deadline = time.monotonic() + 10
        while api.ctx.metrics.open_streams > 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        with http.stream("GET", f"/v1/requests/{ids[2]}/events") as third:
            assert third.status_code == 200
        second.__exit__(None, None, None)
        assert settled(api.ctx) == (0, 0)
