"""The tolerant record parse (schemas.kafka_records) on record batch bytes as a
non-Python producer may write them: header keys that are not UTF-8, null header values."""

from __future__ import annotations

from kafka.record.memory_records import MemoryRecords

from schemas import kafka_records
from tests.raw_kafka import record_batch


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
