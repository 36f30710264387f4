"""Requests that wait in the queue keep their clients' connections alive (issue 36): 200
concurrent requests behind a worker of SLOTS sequences -- streamed chat completions,
streamed messages, waiting (not streamed) chat completions -- each get their first byte
at once (a stream's first chunk; a waiting answer's first space after one interval), then
never wait longer than the keep-alive interval for the next byte, and all complete with
the whole answer."""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor

import anthropic
import httpx
import openai
import pytest

from tests.api.conftest import KEEPALIVE_S, SLOTS

pytestmark = [pytest.mark.broker]

N = 200
MAX_TOKENS = 24
# the API process shares this machine's 2 cores with the worker, recorder, broker and 200
# clients (and, in CI, nothing else; on a shared box, other jobs): a byte is due every
# KEEPALIVE_S, and may be this much later. Without keep-alives a queued client waited for
# minutes (129 s in the issue), so the bound still tells the two apart.
SLACK_S = 5.0
USER = [{"role": "user", "content": "the quick brown fox"}]
RAMP_S = 1.0   # the clients connect over this long (all are open together for many seconds)


async def _one(http: httpx.AsyncClient, kind: str, i: int) -> dict:
    await asyncio.sleep(i * RAMP_S / N)
    if kind == "messages":
        path, body = "/v1/messages", {"model": "tiny", "max_tokens": MAX_TOKENS, "stream": True,
                                      "messages": USER}
    else:
        path, body = "/v1/chat/completions", {"model": "tiny", "max_tokens": MAX_TOKENS,
                                              "messages": USER, "stream": kind == "chat_stream"}
    sent = time.monotonic()
    arrivals, data = [], b""
    async with http.stream("POST", path, json=body) as resp:
        status = resp.status_code
        async for piece in resp.aiter_raw():
            arrivals.append(time.monotonic())
            data += piece
    gaps = [b - a for a, b in zip([sent, *arrivals], arrivals)]
    return {"kind": kind, "status": status, "data": data, "first": gaps[0] if gaps else None,
            "gap": max(gaps[1:], default=0.0), "keepalives": _keepalives(kind, data)}


def _keepalives(kind: str, data: bytes) -> int:
    if kind == "chat_wait":
        return len(data) - len(data.lstrip())
    return data.count(b": keep-alive\n\n") + data.count(b"event: ping\n")


def _complete(r: dict) -> bool:
    text = r["data"].decode()
    if r["kind"] == "chat_wait":
        body = json.loads(text)  # leading whitespace is valid JSON
        return body["choices"][0]["finish_reason"] in ("stop", "length")
    if r["kind"] == "messages":
        return text.rstrip().endswith('event: message_stop\ndata: {"type":"message_stop"}')
    return text.rstrip().endswith("data: [DONE]") and '"finish_reason":"' in text


def _sdks(url: str, token: str) -> tuple[float, object, object]:
    """Waiting answers through the SDKs, sent together last (they wait behind the others):
    their bodies start with keep-alive spaces, which the SDKs' JSON parsing skips."""
    chat = openai.OpenAI(base_url=url + "/v1", api_key=token, max_retries=0, timeout=300)
    claude = anthropic.Anthropic(base_url=url, api_key=token, max_retries=0, timeout=300)

    def timed(call):
        start = time.monotonic()
        got = call()
        return time.monotonic() - start, got

    with ThreadPoolExecutor(2) as pool:
        a = pool.submit(timed, lambda: chat.chat.completions.create(
            model="tiny", max_tokens=MAX_TOKENS, messages=USER))
        b = pool.submit(timed, lambda: claude.messages.create(
            model="tiny", max_tokens=MAX_TOKENS, messages=USER))
        (t1, done), (t2, msg) = a.result(), b.result()
    return min(t1, t2), done, msg


async def _all(url: str, token: str) -> tuple[list[dict], tuple]:
    kinds = (["chat_stream", "messages", "chat_stream", "messages", "chat_wait"] * N)[:N]
    limits = httpx.Limits(max_connections=N + 10, max_keepalive_connections=N + 10)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=300,
                                 headers={"Authorization": f"Bearer {token}"}) as http:

        async def sdks() -> tuple:
            await asyncio.sleep(RAMP_S)
            return await asyncio.to_thread(_sdks, url, token)

        *results, by_sdk = await asyncio.gather(*(_one(http, k, i) for i, k in enumerate(kinds)),
                                                sdks())
        return results, by_sdk


def test_queued_requests_get_a_byte_every_keepalive_interval(queued):
    key = queued.new_key()
    results, (waited, done, msg) = asyncio.run(_all(queued.url, key.token))
    assert [r["status"] for r in results] == [200] * N
    assert all(_complete(r) for r in results)
    streams = [r for r in results if r["kind"] != "chat_wait"]
    waiting = [r for r in results if r["kind"] == "chat_wait"]
    worst_first = max(r["first"] for r in streams)
    worst_gap = max(r["gap"] for r in results)
    sent = sum(r["keepalives"] for r in results)
    summary = (f"{N} requests, {SLOTS} slots: first byte of a stream <= {worst_first:.2f}s, "
               f"of a waiting answer <= {max(r['first'] for r in waiting):.2f}s, longest "
               f"silence {worst_gap:.2f}s, keep-alives sent {sent}")
    print(summary)
    assert worst_first <= KEEPALIVE_S + SLACK_S, summary
    assert max(r["first"] for r in waiting) <= 2 * KEEPALIVE_S + SLACK_S, summary
    assert worst_gap <= KEEPALIVE_S + SLACK_S, summary
    # the queue was real: most requests waited past an interval, and were kept alive
    assert sum(r["keepalives"] > 0 for r in results) > N // 2, summary
    assert done.choices[0].finish_reason in ("stop", "length") and msg.stop_reason
    # each waited past the interval, so its body began with spaces
    assert waited > KEEPALIVE_S, f"the SDK calls did not wait ({waited:.2f}s)"
