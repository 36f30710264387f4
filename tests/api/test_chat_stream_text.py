"""A request redone on another worker (a new `attempt`) while a client streams it.

Unit: SentText (chat chunks cannot be taken back, so a redo is sent only past what was
already sent). End to end, against the real API and broker: the test plays the workers,
publishing two attempts' token events and the final on the results topics, and reads
- `GET /v1/requests/{id}/events`: the second attempt starts the text over (index 0), so a
  reader's text is the final's, never the two attempts run together;
- `POST /v1/chat/completions` with `stream: true`: the chunks add up to the final text
  when the redo repeats it, and end in an error chunk when the redo wrote something else.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

import orjson
import pytest
from sqlalchemy import select

from inflight.api.follow import SentText
from inflight.schemas import FinalEvent, TokenEvent
from inflight.schemas.codec import encode
from inflight.transport.kafka_clients import producer
from inflight.store.models import RequestRow
from tests.api.test_requests import sse_events, streamed_text


def ev(index: int, text: str) -> TokenEvent:
    return TokenEvent(request_id="r", attempt="a", index=index, start=0, token_ids=[], text=text)


def test_a_redo_that_repeats_the_text_sends_only_what_is_new():
    t = SentText()
    assert [t.feed(ev(0, "Hel")), t.feed(ev(1, "lo"))] == ["Hel", "lo"]
    assert t.feed(ev(0, "He")) == ""            # the redo catches up...
    assert t.feed(ev(1, "llo wor")) == " wor"   # ...and goes on past what was sent
    assert t.feed(ev(2, "ld")) == "ld" and t.sent == "Hello world"


def test_a_redo_that_diverges_is_refused():
    t = SentText()
    t.feed(ev(0, "Hello"))
    assert t.feed(ev(0, "Goodbye")) is None


# --- end to end -------------------------------------------------------------------------

class FakeWorkers:
    """Publishes a request's events as workers would (keyed by request id)."""

    def __init__(self, settings):
        self.settings = settings
        self.producer = producer(settings)

    def tokens(self, rid: str, attempt: str, pieces: list[tuple[list[int], str]]) -> None:
        start = 0
        for index, (ids, text) in enumerate(pieces):
            self._send(self.settings.topic_results_tokens, TokenEvent(
                request_id=rid, attempt=attempt, index=index, start=start, token_ids=ids,
                text=text))
            start += len(ids)
        self.producer.flush()

    def final(self, rid: str, attempt: str, ids: list[int], text: str) -> None:
        self._send(self.settings.topic_results, FinalEvent(
            request_id=rid, attempt=attempt, text=text, token_ids=ids, finish_reason="stop",
            worker="w2"))
        self.producer.flush()

    def _send(self, topic: str, event) -> None:
        self.producer.send(topic, key=event.request_id.encode(), value=encode(event))

    def close(self) -> None:
        self.producer.close()


@pytest.fixture
def workers(bare):
    w = FakeWorkers(bare.settings)
    yield w
    w.close()


def reader(target: Callable[[Callable[[object], None]], None]) -> queue.Queue:
    """Runs `target(put)` on a thread; what it puts (and its exception) lands in the queue."""
    got: queue.Queue = queue.Queue()

    def run() -> None:
        try:
            target(got.put)
        except BaseException as exc:  # noqa: BLE001 — handed to the test
            got.put(exc)
        got.put(None)

    threading.Thread(target=run, daemon=True).start()
    return got


def take(got: queue.Queue, n: int) -> list:
    out = []
    for _ in range(n):
        item = got.get(timeout=60)
        if isinstance(item, BaseException):
            raise item
        assert item is not None, f"the stream ended after {out}"
        out.append(item)
    return out


def rest(got: queue.Queue) -> list:
    out = []
    while (item := got.get(timeout=60)) is not None:
        if isinstance(item, BaseException):
            raise item
        out.append(item)
    return out


A1 = [([11, 12], "Hel"), ([13], "lo")]                            # died after "Hello"
A2 = [([11], "He"), ([12, 13, 14], "llo wor"), ([15], "ld")]      # the redo, same text
FINAL = ([11, 12, 13, 14, 15], "Hello world")


def test_events_of_a_redone_request_start_over(bare, workers):
    key = bare.new_key()
    rid = f"redo-{key.info.id}"
    with bare.http(key) as http:
        assert http.post("/v1/requests", json={"prompt": "hi", "request_id": rid}).status_code == 202

        def read(put) -> None:
            with http.stream("GET", f"/v1/requests/{rid}/events") as resp:
                assert resp.status_code == 200
                for event in sse_events(resp):
                    put(event)

        got = reader(read)
        workers.tokens(rid, "a1", A1)
        first = take(got, 2)
        workers.tokens(rid, "a2", A2)
        second = take(got, 3)
        workers.final(rid, "a2", *FINAL)
        last = rest(got)
    events = first + second + last
    assert [(n, d.get("index"), d.get("attempt")) for n, d in events] == [
        ("token", 0, "a1"), ("token", 1, "a1"),
        ("token", 0, "a2"), ("token", 1, "a2"), ("token", 2, "a2"), ("final", None, "a2")]
    assert streamed_text(events) == events[-1][1]["text"] == "Hello world"
    assert [t for n, d in events[2:5] for t in d["token_ids"]] == FINAL[0]


def chat_chunks(bare, key, put) -> None:
    """A streamed chat completion over raw HTTP: each chunk's data, as a dict."""
    with bare.http(key) as http, http.stream("POST", "/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "stream": True}) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if line.startswith("data: "):
                put(line[6:] if line == "data: [DONE]" else orjson.loads(line[6:]))


def filed_request(bare, owner: str) -> str:
    """The id of the one request filed under `owner` (the chat handler chose it)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with bare.store.session() as s:
            ids = s.scalars(select(RequestRow.id).where(RequestRow.owner == owner)).all()
        if ids:
            assert len(ids) == 1
            return ids[0]
        time.sleep(0.05)
    raise AssertionError("the chat completion filed no request")


def content(chunks: list) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or ""
                   for c in chunks if isinstance(c, dict) and c.get("choices"))


def test_chat_stream_of_a_redone_request_sends_each_character_once(bare, workers):
    key = bare.new_key()
    got = reader(lambda put: chat_chunks(bare, key, put))
    rid = filed_request(bare, key.info.owner)
    workers.tokens(rid, "a1", A1)       # the answer (headers) waits for this first delta
    first = take(got, 3)                # role chunk, "Hel", "lo"
    workers.tokens(rid, "a2", A2)
    workers.final(rid, "a2", *FINAL)
    chunks = first + rest(got)
    assert content(first) == "Hello"
    assert content(chunks) == "Hello world"   # not "HelloHello world"
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]][-1] == "stop"
    assert chunks[-1] == "[DONE]" and not any("error" in c for c in chunks[:-1])


def test_chat_stream_of_a_redo_that_wrote_other_text_ends_in_an_error(bare, workers):
    key = bare.new_key()
    got = reader(lambda put: chat_chunks(bare, key, put))
    rid = filed_request(bare, key.info.owner)
    workers.tokens(rid, "a1", A1)
    take(got, 3)
    workers.tokens(rid, "a2", [([21], "Good"), ([22], "bye")])
    workers.final(rid, "a2", [21, 22], "Goodbye")
    chunks = rest(got)
    assert chunks[-2]["error"]["code"] == "restarted" and chunks[-1] == "[DONE]"
    assert content(chunks) == ""        # nothing of the second text was sent
