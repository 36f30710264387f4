"""The tolerant record parse (transport.kafka_records) on record batch bytes as a
non-Python producer may write them: header keys that are not UTF-8, null header values,
and (through a real consumer on the embedded broker, which stores them) corrupt batches."""

from __future__ import annotations

import logging

import pytest
from kafka.record.memory_records import MemoryRecords

from inflight.transport import kafka_records
from tests.raw_kafka import (produce_raw, record_batch, with_bad_crc, with_bad_framing,
                             with_record_count)


def _parse(data: bytes) -> list:
    out = []
    records = MemoryRecords(data)
    while (batch := records.next_batch()) is not None:
        out.extend(batch)
    return out


def test_bad_header_keys_are_escaped_and_neighbours_parse():
    assert kafka_records.install() and kafka_records.install()  # idempotent
    data = record_batch([
        (b"k0", b"v0", [("ok", b"1")]),
        (b"k1", b"v1", [(b"bad-\xff\xfe", b"x"), ("nullval", None), (b"\xc3\xa9t\xc3\xa9", b"")]),
        (None, None, [(b"\x80", None)]),
        (b"k3", b"v3", []),
    ])
    recs = _parse(data)
    assert [(r.offset, r.key, r.value) for r in recs] == [
        (0, b"k0", b"v0"), (1, b"k1", b"v1"), (2, None, None), (3, b"k3", b"v3")]
    assert recs[0].headers == [("ok", b"1")]
    # escaped, re-encodable (a worker forwards headers to the DLQ); valid UTF-8 stays as is
    assert recs[1].headers == [("bad-\\xff\\xfe", b"x"), ("nullval", None), ("été", b"")]
    assert recs[2].headers == [("\\x80", None)]
    assert all(k.encode("utf-8") for r in recs for k, _ in r.headers)
    assert abs(recs[1].timestamp - recs[0].timestamp) < 60_000  # ms, from the batch's base


def test_valid_records_parse_as_before():
    data = record_batch([(b"k%d" % i, b"v" * i, [("h", b"%d" % i)]) for i in range(50)])
    recs = _parse(data)
    assert [(r.offset, r.key, r.value, r.headers) for r in recs] == [
        (i, b"k%d" % i, b"v" * i, [("h", b"%d" % i)]) for i in range(50)]


@pytest.mark.broker
def test_corrupt_batches_are_skipped_with_a_log_and_the_rest_is_read(kafka_settings, caplog):
    from tests.kafka_read import read_topic

    s = kafka_settings
    topic = s.topic_requests
    plain = [(b"k%d" % i, b"v%d" % i, []) for i in range(9)]
    for batch in (record_batch(plain[0:1]),
                  with_bad_crc(record_batch(plain[1:3])),        # offsets 1-2
                  record_batch(plain[3:4]),
                  with_bad_framing(record_batch(plain[4:5])),    # offset 4
                  record_batch(plain[5:6]),
                  with_record_count(record_batch(plain[6:8]), 1),  # 6 comes out, 7 is extra
                  record_batch(plain[8:9])):
        produce_raw(s.kafka_bootstrap, topic, 0, batch)
    with caplog.at_level(logging.ERROR, logger="inflight.kafka"):
        recs = read_topic(s, topic, 5, timeout=10)
    assert [(r.offset, r.key) for r in recs] == [
        (0, b"k0"), (3, b"k3"), (5, b"k5"), (6, b"k6"), (8, b"k8")]
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(skipped) == 3 and all(f"{topic}/0" in m for m in skipped)
    assert "offsets 1..2" in skipped[0] and "offsets 4..4" in skipped[1]
    assert "offsets 7..7" in skipped[2]
