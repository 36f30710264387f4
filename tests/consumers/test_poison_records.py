"""Records produced byte by byte onto the requests topic, as a non-Python producer may, go
through the whole path (real broker, worker with the tiny model, recorder, SQLite): a header
key that is not UTF-8 used to raise CorruptRecordError inside kafka-python's poll() in the
worker and the recorder at every restart, stopping the group. Now a valid request with such
a header runs, an invalid one gets its error row and DLQ copy, and the neighbours complete."""

from __future__ import annotations

import uuid

import orjson
import pytest

from inflight.schemas import InferenceRequest, SamplingParams, encode
from tests.consumers.conftest import Service, make_settings, read_topic, tiny_engine, wait_rows
from tests.raw_kafka import produce_raw

pytestmark = [pytest.mark.broker]


def test_records_with_bad_header_keys_complete_or_fail_cleanly(broker, tiny_model, tmp_path):
    from inflight.store import Store

    url = f"sqlite:///{tmp_path / 'inflight.db'}"
    settings = make_settings(broker, url, partitions=1)
    store = Store(url, create=True)
    tag = uuid.uuid4().hex[:6]
    params = SamplingParams(max_tokens=4, temperature=0)
    ok = [f"ok{i}-{tag}" for i in range(2)]
    valid_bad_key, invalid_bad_key, valid_null, invalid_null = (
        f"{n}-{tag}" for n in ("vbk", "ibk", "vnull", "inull"))
    bad_key = (b"trace-\xff", b"abc")
    invalid = orjson.dumps({"request_id": invalid_bad_key, "prompt": 5})
    invalid2 = orjson.dumps({"request_id": invalid_null, "prompt": 6})

    def req(rid: str) -> bytes:
        return encode(InferenceRequest(request_id=rid, prompt="one two three", params=params))

    produce_raw(settings.kafka_bootstrap, settings.topic_requests, 0, [
        (ok[0].encode(), req(ok[0]), []),
        (valid_bad_key.encode(), req(valid_bad_key), [bad_key]),
        (invalid_bad_key.encode(), invalid, [bad_key, ("x", b"1")]),
        (valid_null.encode(), req(valid_null), [("trace", None)]),
        (invalid_null.encode(), invalid2, [("trace", None), bad_key]),
        (ok[1].encode(), req(ok[1]), [("trace", b"1")]),
    ])
    svc = Service(settings, tiny_engine(tiny_model), store)
    try:
        ids = ok + [valid_bad_key, invalid_bad_key, valid_null, invalid_null]
        rows = wait_rows(store, ids, timeout=60)
        assert {rid: rows[rid].status for rid in ids} == {
            **dict.fromkeys(ok + [valid_bad_key, valid_null], "completed"),
            invalid_bad_key: "failed", invalid_null: "failed"}
        assert rows[invalid_bad_key].error_code == rows[invalid_null].error_code == "invalid_request"
        dlq = read_topic(settings, settings.topic_dlq, until=lambda recs: len(recs) >= 2)
        assert [r.value for r in dlq] == [invalid, invalid2]
        headers = dict(dlq[0].headers)
        assert headers["trace-\\xff"] == b"abc" and headers["x"] == b"1"  # the key, escaped
        headers = dict(dlq[1].headers)
        assert headers["trace"] == b"" and headers["trace-\\xff"] == b"abc"  # null: empty
    finally:
        svc.stop()
        store.close()
