"""The model registry on the real embedded broker: announcements appear, a tombstone takes a
worker off at once, a silent worker drops off after the TTL, a reader that starts late reads
the whole history (its probe, never end offsets), a record that is not one is skipped."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer

from inflight.schemas.registry import ModelRecord, decode_record, registry_key
from inflight.transport.registry_reader import RegistryReader
from inflight.transport.registry_writer import RegistryAnnouncer

pytestmark = [pytest.mark.broker]


def record(model: str, worker: str, **kw) -> ModelRecord:
    now = time.time()
    return ModelRecord(model=model, worker=worker, requests_topic="r", batch_topic="rb",
                       group="g", heartbeat_at=now, heartbeat_s=0.2, started_at=now, **kw)


def wait_for(check, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def test_announce_follow_withdraw_and_expire(kafka_settings):
    s = kafka_settings.updated(registry_heartbeat_s=0.2, registry_ttl_s=1.5)
    a = RegistryAnnouncer(s, [record("small", "w1", max_model_len=512, dtype="float32")])
    b = RegistryAnnouncer(s, [record("big", "w2", adapters=["big-lora"])])
    a.beat(force=True)
    b.beat(force=True)
    reader = RegistryReader(s, name="test").start()
    try:
        assert reader.wait_ready(10), reader.error
        live = {r.model: r for r in wait_for(lambda: len(reader.live()) == 2 and reader.live())}
        assert live["small"].max_model_len == 512 and live["big"].adapters == ["big-lora"]
        first = live["small"].heartbeat_at
        time.sleep(0.3)
        a.beat()
        b.beat()
        assert wait_for(lambda: any(r.model == "small" and r.heartbeat_at > first
                                    for r in reader.live()))
        a.withdraw()  # graceful stop: gone at once
        assert wait_for(lambda: {r.model for r in reader.records()} == {"big"})
        # "big" stops beating (kill -9): its record stays, but not live after the TTL
        assert wait_for(lambda: not reader.live(), timeout=5)
        assert [r.model for r in reader.records()] == ["big"]
    finally:
        reader.close()


def test_a_late_reader_reads_the_whole_history_and_skips_what_is_not_a_record(kafka_settings):
    s = kafka_settings
    p = Producer({"bootstrap.servers": s.kafka_bootstrap})
    p.produce(s.topic_models, b"not json", b"junk 1")
    p.produce(s.topic_models, b'{"type": "model"}', b"junk 2")
    for i in range(50):  # history: many beats of one worker, then others
        p.produce(s.topic_models, record("m", "w0").model_copy(
            update={"heartbeat_at": time.time()}).model_dump_json().encode(),
            registry_key("w0", "m"))
    p.produce(s.topic_models, record("n", "w1").model_dump_json().encode(), registry_key("w1", "n"))
    p.produce(s.topic_models, None, registry_key("w1", "n"))  # withdrawn
    assert p.flush(10) == 0
    reader = RegistryReader(s, name="late").start()
    try:
        assert reader.wait_ready(10)
        # ready means caught up: everything written before it is there, nothing to wait for
        assert [r.model for r in reader.records()] == ["m"]
        assert reader.records_read >= 53
    finally:
        reader.close()


def test_a_reader_waits_for_a_registry_topic_that_does_not_exist_yet(kafka_settings):
    s = kafka_settings.updated(topic_models=kafka_settings.topic_models + ".later")
    reader = RegistryReader(s, name="early").start()
    try:
        assert not reader.wait_ready(1.5)
        assert "does not exist" in (reader.error or "")
        from inflight.transport.topics_admin import create_topics

        create_topics(s, partitions=1)
        assert reader.wait_ready(15), reader.error
    finally:
        reader.close()


def test_record_round_trip_and_open_for_what_comes_next():
    r = record("team-a:lora", "w", kind="embed", parent="base/model", quantization="w4-g128-rtn")
    assert decode_record(r.model_dump_json().encode()) == r
    assert r.key == b"w team-a:lora"
    from inflight.schemas import SchemaError

    with pytest.raises(SchemaError) as e:
        decode_record(r.model_dump_json().replace('"embed"', '"rerank"').encode())
    assert e.value.field == "kind"
