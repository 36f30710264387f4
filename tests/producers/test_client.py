"""Producer client against the real broker and SQLite: routing, partitioning, not-found."""

from __future__ import annotations

import time

import orjson
import pytest

from tests.kafka_read import read_topic

from inflight.schemas import PRIORITY_BATCH, SamplingParams, SchemaError

pytestmark = [pytest.mark.broker]


@pytest.fixture
def client(kafka_settings):
    from inflight.producers.client import Client

    c = Client(kafka_settings)
    yield c
    c.close()




def test_unknown_id_is_not_found_never_a_trace(client):
    from inflight.producers.client import RequestNotFound

    res = client.result("never-submitted")
    assert res.status == "not_found" and not res.found
    assert client.wait("never-submitted", timeout=0.3).status == "not_found"
    t0 = time.monotonic()
    with pytest.raises(RequestNotFound, match="not found"):
        list(client.stream("never-submitted", timeout=1.5))
    assert time.monotonic() - t0 < 5


def test_key_partition_matches_the_producers_partitioner(client, kafka_settings):
    from inflight.producers.client import partition_for

    ids = [client.submit("hi", request_id=f"key-{i}", flush=False) for i in range(20)]
    client.flush()
    recs = read_topic(kafka_settings, kafka_settings.topic_requests, 20)
    assert len(recs) == 20
    for r in recs:
        assert r.partition == partition_for(r.key.decode(), 2)
    assert {r.key.decode() for r in recs} == set(ids)


def test_priority_routes_to_the_batch_topic_and_ids_are_kept(client, kafka_settings):
    rid = client.submit("urgent", SamplingParams(max_tokens=3), request_id="mine-1")
    ids = client.submit_many(["a", "b", {"prompt": "c", "request_id": "given-c"}],
                             priority=PRIORITY_BATCH, batch_id="b1", progress=False)
    assert rid == "mine-1" and ids[2] == "given-c" and len(set(ids)) == 3
    inter = read_topic(kafka_settings, kafka_settings.topic_requests, 1)
    batch = read_topic(kafka_settings, kafka_settings.topic_requests_batch, 3)
    assert [orjson.loads(r.value)["request_id"] for r in inter] == ["mine-1"]
    bodies = [orjson.loads(r.value) for r in batch]
    assert {b["request_id"] for b in bodies} == set(ids)
    assert all(b["priority"] == PRIORITY_BATCH and b["batch_id"] == "b1" for b in bodies)


def test_submit_rejects_bad_input_with_a_schema_error(client):
    with pytest.raises(SchemaError, match="max_tokens"):
        client.submit("hi", {"max_tokens": 0})
    with pytest.raises(SchemaError, match="request_id"):
        client.submit("hi", request_id="bad id with spaces")
