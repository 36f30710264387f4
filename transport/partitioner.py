"""Which partition a key lands on: Kafka's default partitioner (murmur2 of the key bytes,
the sign bit cleared, modulo the partition count), as the Java client, kafka-python and
librdkafka's `murmur2_random` compute it.

NOTE (the invariant): every event of a request is keyed by its request id, and the worker
picks the partition itself (consumers/publisher.py); a client that follows one request
reads only the partition its key maps to (producers/results_reader.py). Both call this
module, so a reader always looks where the worker writes.

    key_hash(key)             once per request (pure-Python murmur2 costs about as much as
                              a send, so the worker keeps it for the request's events)
    partition_of(hash, n)     per message
    partition_for(key, n)     both at once
"""

from __future__ import annotations

from kafka.partitioner.default import murmur2


def key_hash(key: bytes | str) -> int:
    """murmur2 of the key's bytes (a str is UTF-8 encoded), made non-negative."""
    return murmur2(key.encode() if isinstance(key, str) else key) & 0x7FFFFFFF


def partition_of(hashed: int, num_partitions: int) -> int:
    """The partition of a key whose key_hash is `hashed`, in a topic of `num_partitions`."""
    return hashed % num_partitions


def partition_for(key: bytes | str, num_partitions: int) -> int:
    """The partition Kafka's default partitioner gives `key` among `num_partitions`."""
    return partition_of(key_hash(key), num_partitions)
