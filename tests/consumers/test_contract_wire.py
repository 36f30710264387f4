"""The Kafka contract on the real path (embedded broker, tiny model, worker + recorder, SQLite):
every message captured from every topic is valid against the committed JSON Schemas; a
request produced with plain confluent-kafka from a dict completes; headers travel from a
request onto every one of its events (ours set, foreign ones copied), and the recorder
stores the trace id."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from jsonschema import Draft202012Validator

from tests.consumers.conftest import (Service, create_topic, make_settings, read_topic,
                                      tiny_engine, wait_rows)

pytestmark = [pytest.mark.broker]

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE}-00f067aa0ba902b7-01"


def produce_plain(bootstrap: str, topic: str, request: dict, headers: list) -> None:
    """A non-Python-shaped producer: confluent-kafka and json only (no inflight import)."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap})
    p.produce(topic, json.dumps(request).encode(), request["request_id"].encode(),
              headers=headers)
    assert p.flush(10) == 0


def _schemas() -> dict:
    from inflight.schemas.base import SCHEMA_VERSION
    from inflight.schemas.contract import CONTRACT_DIR

    folder = CONTRACT_DIR / f"v{SCHEMA_VERSION}"
    return {p.name.removesuffix(".schema.json"): Draft202012Validator(json.loads(p.read_text()))
            for p in folder.glob("*.schema.json")}


def _headers(rec) -> dict[str, bytes]:
    return {k: (v or b"") for k, v in rec.headers or []}


@pytest.fixture(scope="module")
def service(broker, tiny_model, tmp_path_factory):
    from inflight.producers.client import Client
    from inflight.store import Store

    url = f"sqlite:///{tmp_path_factory.mktemp('contract') / 'inflight.db'}"
    store = Store(url, create=True)
    settings = make_settings(broker, url)
    svc = Service(settings, tiny_engine(tiny_model), store)
    svc.client, svc.store = Client(settings, store=store), store
    try:
        yield svc
    finally:
        svc.stop()
        svc.client.close()


def test_captured_messages_match_the_committed_schemas_and_headers_travel(service):
    s, client = service.settings, service.client
    tag = uuid.uuid4().hex[:6]
    # 1) the Client, with the caller's trace context and a header of its own
    ours = client.submit("one two three", {"max_tokens": 6, "temperature": 0},
                         request_id=f"c-{tag}", metadata={"k": "v"}, tenant="acme",
                         headers=[("traceparent", PARENT.encode()), ("tracestate", b"vendor=1"),
                                  ("x-pipeline-run", b"run-7")])
    # 2) a foreign producer: a plain dict built from the schema, headers of its own (one
    # named like ours, a null value, binary bytes)
    foreign = f"f-{tag}"
    foreign_trace = "0af7651916cd43dd8448eb211c80319c"
    foreign_headers = [("traceparent", f"00-{foreign_trace}-b7ad6b7169203331-01".encode()),
                       ("correlation-id", b"corr-1"), ("inflight-tenant", b"not-parsed"),
                       ("x-null", None), ("x-bin", b"\x00\xff")]
    produce_plain(s.kafka_bootstrap, s.topic_requests,
                  {"request_id": foreign, "prompt": "four five six",
                   "params": {"max_tokens": 5, "temperature": 0}, "stream": True},
                  foreign_headers)
    # 3) a message that cannot run (dead letter + error final), 4) a cancel
    produce_plain(s.kafka_bootstrap, s.topic_requests,
                  {"request_id": f"bad-{tag}", "prompt": "x", "params": {"max_tokens": 0}},
                  [("x-why", b"bad")])
    client.cancel(f"nobody-{tag}")
    rows = wait_rows(service.store, [ours, foreign, f"bad-{tag}"], timeout=60)
    assert rows[ours].status == rows[foreign].status == "completed", rows
    assert rows[f"bad-{tag}"].status == "failed"
    # the recorder stores the trace id of the traceparent
    assert rows[ours].trace_id == TRACE and rows[foreign].trace_id == foreign_trace
    assert client.result(ours).trace_id == TRACE

    schemas = _schemas()
    seen: dict[str, int] = {}

    def check(topic: str, schema: str, until=None) -> list:
        recs = read_topic(s, topic, until=until, timeout=15)
        for rec in recs:
            if rec.value is None or rec.key == f"bad-{tag}".encode() and schema == "request":
                continue
            schemas[schema].validate(json.loads(rec.value))
            seen[schema] = seen.get(schema, 0) + 1
        return recs

    requests = check(s.topic_requests, "request")
    finals_in = lambda recs: {r.key for r in recs if b'"type":"status"' not in r.value}  # noqa: E731
    results = check(s.topic_results, "result-event",
                    until=lambda recs: {ours.encode(), foreign.encode()} <= finals_in(recs))
    tokens = check(s.topic_results_tokens, "token-event")
    check(s.topic_cancel, "cancel")
    check(s.topic_models, "model-record", until=lambda recs: bool(recs))
    dlq = read_topic(s, s.topic_dlq, until=lambda recs: bool(recs), timeout=15)
    assert seen.get("request", 0) >= 2 and seen["result-event"] >= 5 and seen["token-event"] >= 2
    assert seen["cancel"] >= 1 and seen["model-record"] >= 1 and dlq

    # every record we wrote carries content-type and schema-version; the headers schema
    # holds for each (as a name -> text object)
    for rec in requests + results + tokens + dlq:
        hs = _headers(rec)
        if rec.key == foreign.encode() and rec.topic == s.topic_requests:
            continue  # the foreign producer's own record
        if rec.key == f"bad-{tag}".encode() and rec.topic == s.topic_requests:
            continue
        if rec.topic != s.topic_dlq:
            assert hs["content-type"] == b"application/json" and hs["schema-version"] == b"1"
            schemas["headers"].validate({k: v.decode("utf-8", "replace") for k, v in hs.items()})
        if rec.topic != s.topic_dlq and rec.key:
            assert hs["inflight-request-id"] == rec.key

    # the Client's request and its events: our headers, its trace context and its own
    # header copied onto every event (status, deltas, final)
    mine = [r for r in results + tokens if r.key == ours.encode()]
    assert len(mine) >= 3
    for rec in mine:
        hs = _headers(rec)
        assert hs["traceparent"] == PARENT.encode() and hs["tracestate"] == b"vendor=1"
        assert hs["x-pipeline-run"] == b"run-7" and hs["inflight-tenant"] == b"acme"
    # the foreign request's events: its headers unchanged and in order, after ours; the
    # header named like ours is copied, never read as the tenant
    theirs = [r for r in results + tokens if r.key == foreign.encode()]
    assert {json.loads(r.value)["type"] for r in theirs} == {"status", "token", "final"}
    for rec in theirs:
        copied = [(k, v or b"") for k, v in rec.headers
                  if k not in ("content-type", "schema-version", "inflight-request-id")]
        assert copied == [(k, v or b"") for k, v in foreign_headers]
    # the rejected request's error final carries its headers too; its dead letter keeps
    # the original headers plus why
    bad = [r for r in results if r.key == f"bad-{tag}".encode()]
    assert len(bad) == 1 and _headers(bad[0])["x-why"] == b"bad"
    letter = [r for r in dlq if r.key == f"bad-{tag}".encode()][0]
    assert _headers(letter)["x-why"] == b"bad"
    assert _headers(letter)["inflight-error-code"] == b"invalid_request"


def test_a_plain_dict_from_the_schema_completes(service):
    """What docs/kafka-contract.md shows a non-Python producer doing: a dict with the
    schema's fields, JSON, the request id as the key, no headers at all."""
    rid = f"plain-{uuid.uuid4().hex[:6]}"
    produce_plain(service.settings.kafka_bootstrap, service.settings.topic_requests,
                  {"schema_version": 1, "request_id": rid,
                   "messages": [{"role": "user", "content": "seven eight"}],
                   "params": {"max_tokens": 4, "temperature": 0.0, "stop": ["\n"]},
                   "priority": 0, "metadata": {"from": "kcat"}, "submitted_at": time.time()},
                  [])
    row = wait_rows(service.store, [rid], timeout=60)[rid]
    assert row.status == "completed" and row.usage["completion_tokens"] >= 1
    assert row.trace_id is None  # no traceparent: nothing made up downstream


def test_reply_to_gets_the_final_and_deltas_and_refusals_end_at_intake(service):
    """A request naming reply_to: its token deltas and its final also on that topic, keyed
    by request id, with the request's headers; a topic that does not exist, one the
    pattern refuses, one of ours: an error final at intake (nothing generated)."""
    s, client = service.settings, service.client
    tag = uuid.uuid4().hex[:6]
    reply = f"replies-{tag}"
    create_topic(s, reply)
    ok = client.submit({"prompt": "one two", "reply_to": reply, "stream": True},
                       {"max_tokens": 5, "temperature": 0}, request_id=f"r-{tag}",
                       headers=[("x-team", b"a")])
    refused = {f"missing-{tag}": f"nowhere-{tag}", f"ours-{tag}": s.topic_results,
               f"pattern-{tag}": "bad!topic"}
    for rid, topic in refused.items():
        if rid.startswith("pattern"):  # not even a topic name: the schema refuses it
            produce_plain(s.kafka_bootstrap, s.topic_requests,
                          {"request_id": rid, "prompt": "x", "reply_to": topic}, [])
        else:
            client.submit({"prompt": "x", "reply_to": topic}, request_id=rid)
    rows = wait_rows(service.store, [ok, *refused], timeout=60)
    assert rows[ok].status == "completed"
    for rid in refused:
        assert rows[rid].status == "failed" and rows[rid].attempts == 0, rows[rid]
    assert rows[f"missing-{tag}"].error_code == "reply_to_refused"
    assert "does not exist" in rows[f"missing-{tag}"].error
    assert "inflight's own topics" in rows[f"ours-{tag}"].error
    assert "reply_to" in rows[f"pattern-{tag}"].error

    recs = read_topic(s, reply, until=lambda rs: any(b'"type":"final"' in r.value for r in rs))
    assert {r.key for r in recs} == {ok.encode()}
    kinds = [json.loads(r.value)["type"] for r in recs]
    assert kinds.count("final") == 1 and "token" in kinds
    final = [json.loads(r.value) for r in recs if b'"type":"final"' in r.value][0]
    assert final["text"] == rows[ok].output
    for r in recs:
        assert _headers(r)["x-team"] == b"a" and _headers(r)["inflight-request-id"] == ok.encode()


def test_a_stricter_reply_to_pattern_refuses_other_topics(broker, tmp_path):
    from inflight.consumers.reply_to import ReplyTopics
    from inflight.schemas import ConfigError

    s = make_settings(broker, f"sqlite:///{tmp_path / 'x.db'}", reply_to_pattern=r"team-a\..+")
    topics = ReplyTopics(s)
    create_topic(s, "team-b.out")
    assert "INFLIGHT_REPLY_TO_PATTERN" in topics.refusal("team-b.out")
    assert "does not exist" in topics.refusal(f"team-a.{uuid.uuid4().hex[:6]}")
    with pytest.raises(ConfigError, match="INFLIGHT_REPLY_TO_PATTERN"):
        ReplyTopics(s.model_copy(update={"reply_to_pattern": "("}))
