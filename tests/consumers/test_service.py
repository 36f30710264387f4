"""End to end on the real embedded broker, the real engine (tiny random Llama) and the real
databases (SQLite and Postgres): client -> requests topic -> worker -> results topic ->
recorder -> store. One worker + recorder per backend serves every test of this module."""

from __future__ import annotations

import time
import uuid

import orjson
import pytest

from inflight.schemas import ErrorEvent, FinalEvent, SamplingParams, StatusEvent, TokenEvent
from tests.consumers.conftest import (Service, make_settings, migrated, read_topic,
                                      results_by_request, tiny_engine, tokens_by_request,
                                      wait_rows)
from tests.raw_kafka import produce_raw
from tests.tiny_llama import SENTENCES

pytestmark = [pytest.mark.broker]

MAX_BYTES = 20_000  # small message limit so the oversize case is cheap


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def service(request, broker, tiny_model, tmp_path_factory):
    from inflight.producers.client import Client
    from inflight.store import Store

    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('svc') / 'inflight.db'}"
        store = Store(url, create=True)
    else:
        url = migrated(request.getfixturevalue("postgres_url"))
        store = Store(url)
    settings = make_settings(broker, url, kafka_max_message_bytes=MAX_BYTES)
    svc = Service(settings, tiny_engine(tiny_model), store)
    client = Client(settings, store=store)
    svc.client, svc.store = client, store
    try:
        yield svc
    finally:
        svc.stop()
        client.close()


def _prompts(n: int) -> list[str]:
    words = " ".join(SENTENCES).split()
    return [" ".join(words[i:i + 3 + (i * 7) % 20]) for i in range(n)]


def _params(i: int) -> SamplingParams:
    if i % 2:
        return SamplingParams(max_tokens=8 + i, temperature=0.9, top_p=0.95, seed=1000 + i)
    return SamplingParams(max_tokens=8 + i, temperature=0.0)


def test_twenty_prompts_match_engine_generate(service, tiny_model):
    prompts = _prompts(20)
    ids = [service.client.submit(p, _params(i)) for i, p in enumerate(prompts)]
    rows = wait_rows(service.store, ids, timeout=60)
    assert len(rows) == 20 and all(r.status == "completed" for r in rows.values()), rows

    # the wire's SamplingParams is the engine's: the same objects drive the reference run
    ref = tiny_engine(tiny_model).generate(prompts, [_params(i) for i in range(20)])
    for rid, want in zip(ids, ref):
        assert rows[rid].output == want.text
        assert rows[rid].output_token_ids == want.token_ids

    # results topic: one status event, then one final event, of one attempt; tokens topic:
    # coalesced deltas of that attempt, indices 0..n-1 and `start` counting tokens, in order
    events = results_by_request(service.settings, set(ids))
    deltas = tokens_by_request(service.settings)
    for rid in ids:
        status, final = events[rid]
        assert isinstance(status, StatusEvent) and isinstance(final, FinalEvent)
        assert status.attempt == final.attempt and status.worker == final.worker
        tokens = deltas[rid]
        assert {e.attempt for e in tokens} == {final.attempt}
        assert [e.index for e in tokens] == list(range(len(tokens)))
        assert [e.start for e in tokens] == [sum(len(t.token_ids) for t in tokens[:i])
                                             for i in range(len(tokens))]
        assert [t for e in tokens for t in e.token_ids] == final.token_ids == rows[rid].output_token_ids
        assert "".join(e.text for e in tokens) == final.text
    # deltas are coalesced: the first at once, then one per flush interval (not per token)
    assert sum(len(deltas[rid]) for rid in ids) < sum(len(events[rid][1].token_ids) for rid in ids)


def test_stream_yields_tokens_then_final(service):
    rid = service.client.submit("the quick brown fox", SamplingParams(max_tokens=12, temperature=0))
    events = list(service.client.stream(rid, timeout=30))
    assert isinstance(events[-1], FinalEvent)
    assert [e.index for e in events[:-1]] == list(range(len(events) - 1))
    assert "".join(e.text for e in events[:-1]) == events[-1].text


def test_same_request_id_twice_is_one_row_one_run(service):
    w = service.worker
    admitted, dups = w.metrics["admitted"], w.metrics["duplicates"]
    rid = f"dup-{uuid.uuid4().hex[:8]}"
    for _ in range(2):
        service.client.submit("red green blue", SamplingParams(max_tokens=20, temperature=0),
                              request_id=rid, flush=False)
    service.client.flush()
    rows = wait_rows(service.store, [rid])
    assert rows[rid].status == "completed"
    deadline = time.monotonic() + 10
    while w.metrics["duplicates"] == dups and time.monotonic() < deadline:
        time.sleep(0.05)
    assert w.metrics["admitted"] - admitted == 1      # one engine run
    assert w.metrics["duplicates"] - dups == 1
    events = results_by_request(service.settings, {rid})[rid]
    assert sum(isinstance(e, FinalEvent) for e in events) == 1  # one final event


def test_bad_messages_error_rows_dlq_and_neighbours_complete(service):
    s, client = service.settings, service.client
    tag = uuid.uuid4().hex[:6]
    good = [f"good-{tag}-{i}" for i in range(3)]
    long_prompt = " ".join(["the quick brown fox jumps over the lazy dog"] * 80)  # > 512 tokens
    bad = {
        "not_json": (None, b"this is {not json"),
        "wrong_schema": (f"bad-schema-{tag}", orjson.dumps({"request_id": f"bad-schema-{tag}", "prompt": 5})),
        "unknown_param": (f"bad-param-{tag}", orjson.dumps(
            {"request_id": f"bad-param-{tag}", "prompt": "hi", "params": {"beam_width": 4}})),
        "oversize": (f"bad-big-{tag}", orjson.dumps(
            {"request_id": f"bad-big-{tag}", "prompt": "x " * MAX_BYTES})),
        "over_context": (f"bad-ctx-{tag}", orjson.dumps(
            {"request_id": f"bad-ctx-{tag}", "prompt": long_prompt,
             "params": {"max_tokens": 4}})),
    }
    headers = [("trace", b"abc123")]
    client.submit("one two three", SamplingParams(max_tokens=5, temperature=0), request_id=good[0], flush=False)
    for i, (rid, raw) in enumerate(bad.values()):
        # no key on the not-JSON one: nothing names it (a key would: see test_poison_pills)
        produce_raw(s.kafka_bootstrap, s.topic_requests, 0,
                    [(rid.encode() if rid else None, raw, headers)])
        if i == 2:
            client.submit("four five six", SamplingParams(max_tokens=5, temperature=0), request_id=good[1], flush=False)
    client.submit("seven eight", SamplingParams(max_tokens=5, temperature=0), request_id=good[2], flush=False)
    client.flush()

    ids_with_rows = [rid for rid, _ in bad.values() if rid] + good
    rows = wait_rows(service.store, ids_with_rows, timeout=60)
    for rid in good:
        assert rows[rid].status == "completed"
    codes = {name: rows[rid].error_code for name, (rid, _) in bad.items() if rid}
    assert codes == {"wrong_schema": "invalid_request", "unknown_param": "invalid_request",
                     "oversize": "message_too_large", "over_context": "prompt_too_long"}
    for name, (rid, _) in bad.items():
        if rid:
            assert rows[rid].status == "failed" and rows[rid].error, name
    assert "prompt" in rows[bad["wrong_schema"][0]].error
    assert "beam_width" in rows[bad["unknown_param"][0]].error
    assert "512" in rows[bad["over_context"][0]].error

    # every bad message is in the DLQ with its original bytes and headers
    want = {raw for _, raw in bad.values()}
    dlq = read_topic(s, s.topic_dlq, until=lambda recs: want <= {r.value for r in recs})
    by_value = {r.value: r for r in dlq}
    assert want <= set(by_value)
    for raw in want:
        hdrs = dict(by_value[raw].headers)
        assert hdrs["trace"] == b"abc123" and hdrs["inflight-error"]
    # the not-JSON message has no id: an ErrorEvent without request_id on the results topic
    errors = [ev for ev in (r for r in read_topic(s, s.topic_results)) if b'"type":"error"' in ev.value]
    assert any(orjson.loads(e.value)["request_id"] is None for e in errors)
    assert service.worker.metrics["dlq"] >= 5


def test_cancel_running_request_frees_its_blocks(service):
    client, worker = service.client, service.worker
    # make the worker's cancel reader live (it starts at the first cancel after its start)
    client.cancel(f"warmup-{uuid.uuid4().hex[:6]}")
    # NOTE: the tiny model makes 480 tokens in well under a second, faster than a cancel
    # travels; 10 ms a step keeps this request running for ~5 s (a throttle, nothing more).
    engine = worker.engine
    step = engine.step
    engine.step = lambda: (time.sleep(0.01), step())[1]
    try:
        rid = client.submit("hello world", SamplingParams(max_tokens=480, ignore_eos=True,
                                                          temperature=0))
        stream = client.stream(rid, timeout=30)
        first = next(stream)
        assert isinstance(first, TokenEvent)
        client.cancel(rid)
        rest = list(stream)
    finally:
        del engine.step
    assert isinstance(rest[-1], FinalEvent) and rest[-1].finish_reason == "abort"
    assert len(rest[-1].token_ids) < 480
    row = wait_rows(service.store, [rid])[rid]
    assert row.status == "cancelled"
    deadline = time.monotonic() + 10
    while worker.in_flight and time.monotonic() < deadline:
        time.sleep(0.05)
    assert worker.engine.kv.pool.num_used_blocks == 0  # nothing else runs: all blocks back


def test_cancel_before_it_is_polled(service):
    client = service.client
    client.cancel(f"warmup-{uuid.uuid4().hex[:6]}")
    time.sleep(0.5)
    rid = f"early-{uuid.uuid4().hex[:6]}"
    client.cancel(rid)
    time.sleep(0.5)  # the worker has read the cancel before the request arrives
    client.submit("red green", SamplingParams(max_tokens=50), request_id=rid)
    assert wait_rows(service.store, [rid])[rid].status == "cancelled"


def test_unknown_id_is_not_found(service):
    res = service.client.result("no-such-request")
    assert res.status == "not_found" and not res.found and not res.done


def test_poison_pills_end_as_error_rows_and_dlq_copies(service):
    """Produced straight onto the requests topic, as a non-Python producer may: each ends
    as an error row under its id (the Kafka key where the body cannot be parsed) plus a
    DLQ copy the worker could send, and the neighbours complete."""
    from inflight.transport.kafka_clients import producer

    s, client = service.settings, service.client
    tag = uuid.uuid4().hex[:6]
    good = [f"pp-good-{tag}-{i}" for i in range(2)]
    deep = b'{"a": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    keyed = {  # unparsable bodies: the key names the request
        f"pp-utf8-{tag}": b'{"request_id": "x", "prompt": "\xff\xfe"}',
        f"pp-list-{tag}": orjson.dumps([{"request_id": "nope", "prompt": "hi"}]),
        f"pp-deep-{tag}": deep,
    }
    null_id, huge_id = f"pp-null-{tag}", f"pp-huge-{tag}"
    null_raw = orjson.dumps({"request_id": null_id, "prompt": 5})
    huge_raw = orjson.dumps({"request_id": huge_id, "prompt": "x " * 100_000})  # 200 KB
    client.submit("one two three", SamplingParams(max_tokens=5, temperature=0),
                  request_id=good[0])
    produce_raw(s.kafka_bootstrap, s.topic_requests, 0,
                [(rid.encode(), raw, []) for rid, raw in keyed.items()])
    # a null header value (kafka-python's producer refuses to send one, so did the DLQ copy)
    produce_raw(s.kafka_bootstrap, s.topic_requests, 0,
                [(null_id.encode(), null_raw, [("trace", None), ("x", b"1")])])
    # over what the worker's producer may send (max_request_size): the old worker retried
    # its DLQ copy forever
    big = producer(s, max_request_size=4_000_000)
    big.send(s.topic_requests, key=huge_id.encode(), value=huge_raw).get(timeout=30)
    big.close()
    client.submit("four five six", SamplingParams(max_tokens=5, temperature=0),
                  request_id=good[1])

    ids = good + list(keyed) + [null_id, huge_id]
    rows = wait_rows(service.store, ids, timeout=60)
    assert {rid: rows[rid].status for rid in ids} == {
        **dict.fromkeys(good, "completed"), **dict.fromkeys(ids[2:], "failed")}
    assert {rid: rows[rid].error_code for rid in ids[2:]} == {
        **dict.fromkeys(keyed, "invalid_request"), null_id: "invalid_request",
        huge_id: "message_too_large"}
    assert "JSON object" in rows[f"pp-list-{tag}"].error
    dlq = read_topic(s, s.topic_dlq, until=lambda recs: set(ids[2:]) <= {
        r.key.decode() for r in recs if r.key})
    copies = {r.key.decode(): r for r in dlq if r.key and r.key.decode() in ids}
    for rid, raw in keyed.items():
        assert copies[rid].value == raw
    assert copies[null_id].value == null_raw
    assert dict(copies[null_id].headers)["trace"] == b"" and dict(copies[null_id].headers)["x"] == b"1"
    huge = dict(copies[huge_id].headers)
    assert copies[huge_id].value == huge_raw[:65536] and huge["inflight-truncated"]
    assert huge["inflight-original-bytes"] == str(len(huge_raw)).encode()


def test_a_stream_started_after_the_request_finished_returns_all_of_it(service):
    """From the deltas (a streaming request) or from the final alone (a request that did not
    stream: batch priority by default, or stream=False)."""
    client = service.client
    p = SamplingParams(max_tokens=12, temperature=0)
    streamed = client.submit("the quick brown fox", p)
    quiet = client.submit("the quick brown fox", p, priority=10)  # batch: stream off
    rows = wait_rows(service.store, [streamed, quiet])
    for rid in (streamed, quiet):
        events = list(client.stream(rid, timeout=30))
        final = events[-1]
        assert isinstance(final, FinalEvent) and final.text == rows[rid].output
        tokens = [e for e in events if isinstance(e, TokenEvent)]
        assert [e.index for e in tokens] == list(range(len(tokens)))
        assert "".join(e.text for e in tokens) == final.text
        assert [t for e in tokens for t in e.token_ids] == rows[rid].output_token_ids
    assert rows[streamed].output == rows[quiet].output            # same prompt, greedy
    deltas = tokens_by_request(service.settings)
    assert streamed in deltas and quiet not in deltas             # nothing streamed for it
