"""Results while a batch runs (producers.batch_partial) on the real store, SQLite and
Postgres: the finished lines so far, each the line the final files will hold, read in
pages and resumed by cursor with nothing lost or repeated while more requests finish;
rows inside the settle window wait for the next read; a bad cursor is a clear error."""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timezone

import orjson
import pytest

from inflight.producers.batch_partial import decode_cursor, encode_cursor, read_page
from inflight.schemas.errors import SchemaError
from inflight.store import Store


def finish(store: Store, bid: str, names: list[str], status: str = "completed") -> None:
    now = datetime.now(timezone.utc)
    store.upsert_requests([{
        "id": f"{bid}-{n}", "batch_id": bid, "custom_id": n, "status": status,
        "output": f"out {n}" if status == "completed" else None,
        "finish_reason": "stop" if status == "completed" else "abort",
        "usage": {"prompt_tokens": 2, "completion_tokens": 3} if status == "completed" else None,
        "error": None if status == "completed" else "cancelled",
        "error_code": None if status == "completed" else "cancelled",
        "finished_at": now} for n in names])


def read_all(store, bid, after, settle_s=0.0, limit=4):
    lines = []
    while True:
        page = read_page(store, store.require_batch(bid), after=after, default_model="tiny",
                         limit=limit, settle_s=settle_s)
        lines += [orjson.loads(x) for x in page.lines]
        after = page.next_after
        if not page.has_more:
            return lines, after


def test_partial_lines_resume_by_cursor(db_url):
    store = Store(db_url, create=True)
    bid = f"batch_{uuid.uuid4().hex[:10]}"
    try:
        store.create_batch(bid, endpoint="/v1/chat/completions", input_file_id=None)
        store.transition_batch(bid, "in_progress")
        store.upsert_requests([{"id": f"{bid}-q{i}", "batch_id": bid, "custom_id": f"q{i}",
                                "status": "queued"} for i in range(20)])
        finish(store, bid, [f"q{i}" for i in range(7)])
        first, cursor = read_all(store, bid, None)
        assert sorted(x["custom_id"] for x in first) == sorted(f"q{i}" for i in range(7))
        line = next(x for x in first if x["custom_id"] == "q0")
        assert line["response"]["status_code"] == 200 and line["error"] is None
        assert line["response"]["body"]["choices"][0]["message"]["content"] == "out q0"
        assert line["response"]["body"]["usage"]["total_tokens"] == 5
        time.sleep(0.01)
        finish(store, bid, [f"q{i}" for i in range(7, 12)])
        finish(store, bid, ["q12"], status="cancelled")
        more, cursor2 = read_all(store, bid, cursor)
        assert sorted(x["custom_id"] for x in more) == sorted(f"q{i}" for i in range(7, 13))
        assert next(x for x in more if x["custom_id"] == "q12")["error"]["code"] == "batch_cancelled"
        assert read_all(store, bid, cursor2) == ([], cursor2)     # nothing new: same cursor
        from inflight.producers.batch_jobs import batch_object, live_counts

        counts = live_counts(store, store.require_batch(bid))   # counted now, nothing written
        assert (counts.request_completed, counts.request_cancelled) == (12, 1)
        assert batch_object(counts)["request_counts"] == {"total": 0, "completed": 12,
                                                          "failed": 0}
        assert store.require_batch(bid).request_completed == 0
        # rows written within the settle window wait for a later read
        finish(store, bid, ["q13"])
        assert read_all(store, bid, cursor2, settle_s=30.0)[0] == []
        assert [x["custom_id"] for x in read_all(store, bid, cursor2)[0]] == ["q13"]
    finally:
        store.close()


def test_cursor_round_trip_and_bad_cursor():
    at = datetime(2026, 12, 3, 12, 0, 0, 123456, tzinfo=timezone.utc)
    assert decode_cursor(encode_cursor(at, "batch_x-q:1")) == (at, "batch_x-q:1")
    with pytest.raises(SchemaError) as info:
        decode_cursor("not-a-cursor")
    assert info.value.field == "after"
