"""The one key -> partition rule (transport/partitioner.py) is Kafka's default partitioner:
the Java client's murmur2 on its own test vectors, and the partition librdkafka's producer
(`murmur2_random`, the worker's fallback when it does not know the partition count) picks
for a keyed message on the real broker."""

from __future__ import annotations

import pytest

from inflight.transport.partitioner import key_hash, partition_for, partition_of
from tests.consumers.conftest import make_settings

# org.apache.kafka.common.utils.UtilsTest.testMurmur2: Utils.murmur2(key) as a Java int
JAVA_MURMUR2 = {b"21": -973932308, b"foobar": -790332482,
                b"a-little-bit-long-string": -985981536,
                b"a-little-bit-longer-string": -1486304829,
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
                b"abc": 479470107}


def test_the_hash_is_the_java_clients_murmur2_made_positive():
    for key, java in JAVA_MURMUR2.items():
        assert key_hash(key) == java & 0x7FFFFFFF, key
        assert key_hash(key.decode()) == key_hash(key)   # a str is its UTF-8 bytes
    assert partition_for("foobar", 7) == partition_of(key_hash(b"foobar"), 7) \
        == (-790332482 & 0x7FFFFFFF) % 7


@pytest.mark.broker
def test_librdkafka_puts_a_keyed_message_where_partition_for_says(broker, tmp_path):
    from inflight.transport.librdkafka_producer import RdProducer

    settings = make_settings(broker, f"sqlite:///{tmp_path / 'x.db'}", partitions=4)
    p = RdProducer(settings)
    try:
        keys = [f"request-{i}".encode() for i in range(40)]
        sent = [p.send(settings.topic_results, key=k, value=b"x") for k in keys]
        got = [fut.get(timeout=30).partition() for fut in sent]
    finally:
        p.close(10)
    assert got == [partition_for(k, 4) for k in keys]
    assert len(set(got)) > 1  # the keys spread: the check could fail
