"""One results reader for many followed requests, against the real broker: every follow
gets exactly its own request's stream (deltas of other requests on the same partitions
never leak in), a follow started late replays from its submit time (the reader's
checkpoints, or the broker's offsets_for_times for a time before the reader started),
the cap on follows is enforced and every close frees its place."""

from __future__ import annotations

import random
import time

import pytest

from inflight.schemas import FinalEvent, TokenEvent
from inflight.schemas.codec import encode
from inflight.schemas.errors import CapacityError
from inflight.transport.kafka_clients import producer
from tests.producers.reader_state import followed, wait_ready

pytestmark = [pytest.mark.broker]


class Publisher:
    """Publishes requests' events as workers do (keyed by request id)."""

    def __init__(self, settings):
        self.s = settings
        self.p = producer(settings)

    def delta(self, rid: str, index: int, text: str, attempt: str = "a1") -> None:
        self.p.send(self.s.topic_results_tokens, key=rid.encode(), value=encode(TokenEvent(
            request_id=rid, attempt=attempt, index=index, start=index, token_ids=[index + 10],
            text=text)))

    def final(self, rid: str, text: str, n: int, attempt: str = "a1") -> None:
        self.p.send(self.s.topic_results, key=rid.encode(), value=encode(FinalEvent(
            request_id=rid, attempt=attempt, text=text, token_ids=[i + 10 for i in range(n)],
            finish_reason="length", worker="w")))

    def request(self, rid: str, pieces: list[str]) -> None:
        for i, piece in enumerate(pieces):
            self.delta(rid, i, piece)
        self.final(rid, "".join(pieces), len(pieces))

    def flush(self) -> None:
        self.p.flush()

    def close(self) -> None:
        self.p.close()


@pytest.fixture
def reader(kafka_settings):
    from inflight.producers.results_reader import ResultsReader

    r = ResultsReader(kafka_settings, max_follows=500).start()
    assert wait_ready(r, 30)
    yield r
    r.close()


@pytest.fixture
def pub(kafka_settings):
    p = Publisher(kafka_settings)
    yield p
    p.close()


def stream_of(follow, timeout: float = 30.0) -> tuple[str, list]:
    events = list(follow.events(time.monotonic() + timeout, TimeoutError))
    text = ""
    for e in events:
        if isinstance(e, TokenEvent):
            text = (text if e.index else "") + e.text
    return text, events


def test_many_follows_on_one_reader_each_get_only_their_request(reader, pub):
    rng = random.Random(0)
    ids = [f"many-{i}" for i in range(200)]
    follows = {rid: reader.follow(rid) for rid in ids}   # before publishing: nothing to replay
    assert followed(reader) == 200
    pieces = {rid: [f"<{rid}:{k}>" for k in range(rng.randrange(1, 6))] for rid in ids}
    order = [(rid, i) for rid in ids for i in range(len(pieces[rid]))]
    rng.shuffle(order)   # interleaved on the partitions, in each request's own order
    sent = {rid: 0 for rid in ids}
    for rid, _ in order:
        pub.delta(rid, sent[rid], pieces[rid][sent[rid]])
        sent[rid] += 1
    for rid in ids:
        pub.final(rid, "".join(pieces[rid]), len(pieces[rid]))
    pub.flush()
    for rid, f in follows.items():
        text, events = stream_of(f)
        assert text == "".join(pieces[rid]) == events[-1].text
        assert all(e.request_id == rid for e in events)
        # (a final read before the last deltas brings their text in one more delta)
        assert [e.index for e in events[:-1]] == list(range(len(events) - 1))
        assert len(events) - 1 <= len(pieces[rid])
        f.close()
    assert followed(reader) == 0


def test_a_late_follow_replays_from_its_submit_time(reader, pub, kafka_settings):
    from inflight.producers.results_reader import ResultsReader

    since = time.time()
    pub.request("late-1", ["one ", "two ", "three"])
    pub.flush()
    time.sleep(0.5)   # read by the reader and passed over (nobody followed it then)
    with reader.follow("late-1", since=since) as f:
        assert stream_of(f)[0] == "one two three"
    # a reader started after the request: the broker's offsets_for_times finds it
    fresh = ResultsReader(kafka_settings, max_follows=10).start()
    try:
        with fresh.follow("late-1", since=since - 1) as f:
            text, events = stream_of(f)
        assert text == "one two three" == events[-1].text
    finally:
        fresh.close()


def test_a_new_attempt_starts_over_and_attempts_never_mix(reader, pub):
    f = reader.follow("redo-1")
    pub.delta("redo-1", 0, "Hel", attempt="a1")
    pub.delta("redo-1", 1, "lo", attempt="a1")
    pub.delta("redo-1", 0, "Hello", attempt="a2")
    pub.delta("redo-1", 2, " late", attempt="a1")   # of the attempt given up on: ignored
    pub.delta("redo-1", 1, " world", attempt="a2")
    pub.flush()
    deltas = [f.get(time.monotonic() + 30) for _ in range(4)]
    pub.final("redo-1", "Hello world", 2, attempt="a2")
    pub.flush()
    text, events = stream_of(f)
    f.close()
    events = deltas + events
    assert [(e.attempt, getattr(e, "index", None)) for e in events] == [
        ("a1", 0), ("a1", 1), ("a2", 0), ("a2", 1), ("a2", None)]
    assert events[2].text + events[3].text == events[-1].text == "Hello world"


def test_the_cap_on_follows_and_every_close_frees_a_place(kafka_settings):
    from inflight.producers.results_reader import ResultsReader

    r = ResultsReader(kafka_settings, max_follows=3)
    try:
        fs = [r.follow(f"cap-{i}") for i in range(3)]
        with pytest.raises(CapacityError, match="3"):
            r.follow("cap-3")
        fs[1].close()
        fs[1].close()   # idempotent
        fs.append(r.follow("cap-3"))
        assert followed(r) == 3
        for f in fs:
            f.close()
        assert followed(r) == 0
    finally:
        r.close()


def test_client_wait_sees_a_row_that_ended_without_an_event(kafka_settings, tmp_path):
    """Client.wait follows the request's final event, and asks the store now and then
    too: a row ended by the store alone (a batch's cancel grace) ends the wait."""
    import threading

    from inflight.producers.client import Client
    from inflight.schemas import FinalEvent, InferenceRequest
    from inflight.store import Store, final_row, queued_row

    store = Store(f"sqlite:///{tmp_path / 'wait.db'}", create=True)
    client = Client(kafka_settings, store=store)
    try:
        req = InferenceRequest(request_id="wait-1", prompt="hi", submitted_at=time.time())
        store.upsert_requests([queued_row(req)])
        end = threading.Timer(0.5, lambda: store.upsert_requests([final_row(FinalEvent(
            request_id="wait-1", text="", finish_reason="abort"))]))
        end.start()
        t0 = time.monotonic()
        res = client.wait("wait-1", timeout=20)
        assert res.done and time.monotonic() - t0 < 10
        assert followed(client.results) == 0
    finally:
        client.close()
        store.close()
