"""The embedded broker: up and down, a real produce/consume round trip, port clashes."""

from __future__ import annotations

import time

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from inflight.cli.broker import EmbeddedBroker
from inflight.cli.topics import create_topics
from inflight.schemas.errors import BrokerError


def test_round_trip_through_kafka_python(kafka_settings):
    s = kafka_settings
    producer = KafkaProducer(acks="all", **s.kafka_common())
    sent = {f"key-{i}".encode(): f"value-{i}".encode() for i in range(20)}
    for k, v in sent.items():
        producer.send(s.topic_requests, key=k, value=v, headers=[("h", b"1")])
    producer.flush()
    producer.close()

    consumer = KafkaConsumer(auto_offset_reset="earliest", enable_auto_commit=False, **s.kafka_common())
    consumer.assign([TopicPartition(s.topic_requests, p) for p in range(2)])
    got: dict[bytes, bytes] = {}
    deadline = time.monotonic() + 15
    while len(got) < len(sent) and time.monotonic() < deadline:
        for records in consumer.poll(300).values():
            for r in records:
                got[r.key] = r.value
                assert r.headers == [("h", b"1")]
    consumer.close()
    assert got == sent


def test_topics_create_is_idempotent(kafka_settings):
    again = create_topics(kafka_settings, partitions=2)
    assert set(again) == set(kafka_settings.topics())
    assert set(again.values()) == {"exists"}


def test_start_stop_and_port_clash():
    with EmbeddedBroker() as b:
        assert b.alive()
        clash = EmbeddedBroker(port=b.port)
        with pytest.raises(BrokerError, match="already in use"):
            clash.start()
        pid = b.proc.pid
    assert not b.alive()
    # the process is gone, and the port is free again
    with EmbeddedBroker(port=b.port) as again:
        assert again.alive() and again.proc.pid != pid


def test_cli_broker_prints_bootstrap_and_stops_on_sigint(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "inflight", "broker", "--json", "--partitions", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "INFLIGHT_CACHE_DIR": str(tmp_path)})
    try:
        line = proc.stdout.readline()
        import orjson

        info = orjson.loads(line)
        assert info["bootstrap"].startswith("127.0.0.1:")
        assert info["topics"]["inflight.requests"] == "created"
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(15) == 0
