"""The batch-job functions on the real store (SQLite and Postgres) with a recording
publisher standing in for Kafka: validate, enqueue (and its resume after a crash),
sweep (finalize once under racing sweepers, expire), cancel. The same functions run
under Celery with the real broker in test_batch_e2e.py."""

from __future__ import annotations

import shutil
import threading
from datetime import timedelta
from pathlib import Path

import orjson
import pytest
from sqlalchemy import select, update

from inflight.producers import batch_jobs as jobs
from inflight.producers.batch_lines import request_id_for
from inflight.schemas import BrokerError, Settings, StateError, decode_request
from inflight.store import BatchRow, FileRow, Store
from tests.store.local_s3 import local_s3, s3_url  # noqa: F401 - the fixture

CHAT = "/v1/chat/completions"


class Recorder:
    """Records what would go to Kafka; can fail after `fail_after` publishes (optionally
    after the messages went out, like a process killed before its progress update)."""

    def __init__(self, fail_after: int | None = None, after_send: bool = False):
        self.sent: list[tuple[str, bytes]] = []
        self.cancels: list[str] = []
        self.batch_cancels: list[str] = []
        self.fail_after, self.after_send, self.calls = fail_after, after_send, 0

    def publish_encoded(self, items, *, topic):
        self.calls += 1
        items = list(items)
        failing = self.fail_after is not None and self.calls > self.fail_after
        if failing and not self.after_send:
            raise BrokerError("broker gone")
        self.sent += items
        if failing:
            raise BrokerError("killed after sending")
        return len(items)

    def cancel_many(self, ids):
        ids = list(ids)
        self.cancels += ids
        return len(ids)

    def cancel_batch_requests(self, batch_id):
        self.batch_cancels.append(batch_id)


@pytest.fixture(scope="module")
def migrated_sqlite(tmp_path_factory) -> Path:
    """One migrated SQLite file; each test copies it (Alembic once, not per test)."""
    path = tmp_path_factory.mktemp("batch-jobs") / "template.db"
    Store(f"sqlite:///{path}", create=True).close()
    return path


@pytest.fixture(params=["db-files", "s3-files"])
def store(request, db_url, migrated_sqlite):
    """The store on SQLite and Postgres; on SQLite also with file content on object storage
    (INFLIGHT_FILES_URL=s3://..., moto's server): every test here must behave the same."""
    files: dict = {}
    if request.param == "s3-files":
        if not db_url.startswith("sqlite"):
            pytest.skip("object storage is checked once, beside SQLite")
        s3 = request.getfixturevalue("local_s3")
        files = {"files_url": s3_url(s3), "files_endpoint": s3.endpoint}
    if db_url.startswith("sqlite"):
        shutil.copy(migrated_sqlite, db_url.removeprefix("sqlite:///"))
        s = Store(db_url, **files)
    else:
        s = Store(db_url, create=True)
    yield s
    s.close()


def ctx_for(store: Store, pub=None, **settings) -> jobs.JobContext:
    s = Settings(database_url=store.url, **{"batch_enqueue_chunk": 4, **settings})
    return jobs.JobContext(store=store, publisher=pub or Recorder(), settings=s,
                           context_length=512, model_name="tiny")


def lines(n: int, start: int = 0, **body) -> list[bytes]:
    return [orjson.dumps({"custom_id": f"c{i}", "method": "POST", "url": CHAT,
                          "body": {"messages": [{"role": "user", "content": f"q{i}"}],
                                   "max_tokens": 4, **body}}) for i in range(start, start + n)]


def new_batch(store: Store, content: list[bytes], window: str = "24h"):
    f = store.create_file([b"\n".join(content) + b"\n"], purpose="batch", filename="in.jsonl")
    return jobs.create_batch(store, input_file_id=f.id, endpoint=CHAT, completion_window=window)


def finish(store: Store, ids, status="completed"):
    store.upsert_requests([{"id": i, "status": status, "output": f"out-{i}",
                            "finish_reason": "stop" if status == "completed" else "error",
                            "usage": {"prompt_tokens": 2, "completion_tokens": 1},
                            "error": None if status == "completed" else "boom",
                            "error_code": None if status == "completed" else "engine_error"}
                           for i in ids])


def test_create_batch_checks_its_arguments(store):
    f = store.create_file([b"{}\n"], purpose="batch", filename="x")
    out = store.create_file([b"{}\n"], purpose="batch_output", filename="y")
    for kw, field in [({"endpoint": "/v1/moderations"}, "endpoint"),
                      ({"completion_window": "soon"}, "completion_window"),
                      ({"metadata": {"k": 5}}, "metadata"),
                      ({"input_file_id": out.id}, "input_file_id")]:
        with pytest.raises(Exception) as e:
            jobs.create_batch(store, **{"input_file_id": f.id, "endpoint": CHAT, **kw})
        assert getattr(e.value, "field", None) == field
    assert jobs.parse_window("90m") == timedelta(minutes=90)


def test_bad_lines_fail_the_batch_and_publish_nothing(store):
    content = lines(3) + [b"garbage", lines(1)[0]] + lines(1, 5, max_tokens=600)
    b = new_batch(store, content)
    ctx = ctx_for(store)
    assert jobs.validate_and_enqueue(ctx, b.id) == "failed"
    b = store.get_batch(b.id)
    assert b.status == "failed" and b.failed_at is not None and ctx.publisher.sent == []
    assert [(e["line"], e["param"]) for e in b.errors] == [(4, None), (5, "custom_id"),
                                                           (6, "body.max_tokens")]
    assert "context of 512" in b.errors[2]["message"]
    assert store.list_batch(b.id) == []  # no request rows either
    assert jobs.batch_object(b)["errors"]["data"][0]["line"] == 4
    # empty file
    b2 = new_batch(store, [b"  "])
    assert jobs.validate_and_enqueue(ctx, b2.id) == "failed"
    assert store.get_batch(b2.id).errors[0]["code"] == "empty_file"


def test_enqueue_publishes_every_request_once_with_rows(store):
    b = new_batch(store, lines(10))
    ctx = ctx_for(store)
    assert jobs.validate_and_enqueue(ctx, b.id) == "enqueued"
    b = store.get_batch(b.id)
    assert (b.status, b.request_total, b.lines_validated, b.lines_enqueued) == ("in_progress", 10, 10, 10)
    want = [request_id_for(b.id, f"c{i}") for i in range(10)]
    assert [rid for rid, _ in ctx.publisher.sent] == want
    req = decode_request(ctx.publisher.sent[3][1])
    assert req.batch_id == b.id and req.priority == 10 and req.stream is False
    rows = {r.id: r for r in store.list_batch(b.id)}
    assert sorted(rows) == sorted(want) and rows[want[3]].custom_id == "c3"
    assert rows[want[3]].status == "queued" and rows[want[3]].priority == 10
    assert jobs.validate_and_enqueue(ctx, b.id) == "nothing to do"  # a second delivery


@pytest.mark.parametrize("after_send", [False, True])
def test_enqueue_killed_midway_resumes_without_duplicate_rows(store, after_send):
    b = new_batch(store, lines(10))
    pub = Recorder(fail_after=1, after_send=after_send)  # second chunk of 4 fails
    ctx = ctx_for(store, pub)
    with pytest.raises(BrokerError):
        jobs.validate_and_enqueue(ctx, b.id)
    assert store.get_batch(b.id).lines_enqueued == 4
    pub.fail_after = None
    assert jobs.validate_and_enqueue(ctx, b.id) == "enqueued"
    ids = [rid for rid, _ in pub.sent]
    want = [request_id_for(b.id, f"c{i}") for i in range(10)]
    assert set(ids) == set(want)
    # a chunk already sent when the task died is sent again (same ids: workers and the
    # store run and keep each once); nothing else repeats
    assert len(ids) - len(want) == (4 if after_send else 0)
    assert len(store.list_batch(b.id)) == 10


def test_busy_batch_is_retried_later(store):
    b = new_batch(store, lines(2))
    assert store.claim_batch(b.id, "someone", ttl_s=60)
    with pytest.raises(jobs.Retry):
        jobs.validate_and_enqueue(ctx_for(store), b.id)


def _ready(store, n=6, failed=1):
    b = new_batch(store, lines(n))
    ctx = ctx_for(store)
    jobs.validate_and_enqueue(ctx, b.id)
    ids = [request_id_for(b.id, f"c{i}") for i in range(n)]
    finish(store, ids[:n - failed])
    finish(store, ids[n - failed:], "failed")
    return b, ids


def test_sweep_finalizes_with_output_and_error_files(store):
    b, ids = _ready(store)
    ctx = ctx_for(store)
    finish_later = ids[0]
    store.upsert_requests([{"id": finish_later, "status": "running"}])  # no effect: final stays
    report = jobs.sweep(ctx)
    assert report.completed == [b.id]
    b = store.get_batch(b.id)
    assert b.status == "completed" and b.request_counts == {"total": 6, "completed": 5, "failed": 1}
    assert b.finalizing_at <= b.completed_at
    out = [orjson.loads(line) for _, line in store.iter_file_lines(b.output_file_id)]
    err = [orjson.loads(line) for _, line in store.iter_file_lines(b.error_file_id)]
    assert [o["custom_id"] for o in out] == [f"c{i}" for i in range(5)]
    assert out[0]["response"]["body"]["choices"][0]["message"]["content"] == f"out-{ids[0]}"
    assert out[0]["response"]["body"]["model"] == "tiny"
    assert [e["custom_id"] for e in err] == ["c5"] and err[0]["response"]["status_code"] == 500
    assert jobs.sweep(ctx).completed == []  # nothing left to do


@pytest.mark.parametrize("end", ["completed", "expired", "cancelled"])
def test_racing_sweepers_end_a_batch_once(db_url, end):
    """Six sweepers (own connections) at once, many rounds, on a batch that is done, past
    its window, or cancelled: one of them ends it, with one output file and the counts of
    what that file holds."""
    stores = [Store(db_url, create=i == 0) for i in range(6)]
    try:
        if end == "completed":
            b, ids = _ready(stores[0], n=40, failed=0)
        else:  # 10 done, 30 still running
            b = new_batch(stores[0], lines(40))
            jobs.validate_and_enqueue(ctx_for(stores[0]), b.id)
            ids = [request_id_for(b.id, f"c{i}") for i in range(40)]
            finish(stores[0], ids[30:])
            stores[0].upsert_requests([{"id": i, "status": "running"} for i in ids[:30]])
            if end == "expired":
                _age(stores[0], b.id, expires_at=b.created_at)
            else:
                jobs.cancel_batch(stores[0], Recorder(), b.id)
        reports = []
        barrier = threading.Barrier(len(stores))

        def run(s):
            ctx = ctx_for(s, batch_cancel_grace_s=0.0)
            barrier.wait()
            for _ in range(5):
                reports.append(jobs.sweep(ctx, batch_ids=[b.id]))

        threads = [threading.Thread(target=run, args=(s,)) for s in stores]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sum(len(getattr(r, end)) for r in reports) == 1
        with stores[0].session() as s:
            files = s.scalars(select(FileRow.id).where(FileRow.filename.startswith(b.id))).all()
        b = stores[0].get_batch(b.id)
        assert b.status == end
        assert sorted(files) == sorted(f for f in (b.output_file_id, b.error_file_id) if f)
        unfinished = 0 if end == "completed" else 30  # ids[:30] were still running
        assert (b.request_completed, getattr(b, f"request_{end}", 0)) == (
            40 - unfinished, unfinished or 40)
        assert stores[0].get_file(b.output_file_id).line_count == 40 - unfinished
    finally:
        for s in stores:
            s.close()


@pytest.mark.parametrize("lands", ["after_the_end", "while_files_are_written"])
def test_a_stale_count_never_shows_on_an_ended_batch(db_url, lands):
    """Sweeper A counts the requests, then stalls (CPU, a SQLite write lock) before writing
    its count, while sweeper B ends the cancel; A's old count (nothing done yet) lands after
    the end, or while B writes the files. The ended batch shows the counts its files hold.
    (A cancelled batch showing 0 completed made the e2e cancel test flaky.)"""
    a, other = Store(db_url, create=True), Store(db_url)
    try:
        b = new_batch(a, lines(4))
        jobs.validate_and_enqueue(ctx_for(a), b.id)
        ids = [request_id_for(b.id, f"c{i}") for i in range(4)]
        counted, go = threading.Event(), threading.Event()
        count = a.count_by_status

        def stalled(batch_id=None):
            c = count(batch_id)
            counted.set()
            assert go.wait(30)
            return c

        a.count_by_status = stalled  # type: ignore[method-assign]
        stale = threading.Thread(target=jobs.sweep, args=(ctx_for(a),),
                                 kwargs={"batch_ids": [b.id]})
        stale.start()
        assert counted.wait(30)

        def land():
            go.set()
            stale.join()

        if lands == "while_files_are_written":
            create_file = other.create_file

            def create_then_land(*args, **kw):
                row = create_file(*args, **kw)
                if not go.is_set():
                    land()
                return row

            other.create_file = create_then_land  # type: ignore[method-assign]
        ctx = ctx_for(other)
        finish(other, ids[:2])
        jobs.cancel_batch(other, ctx.publisher, b.id)
        finish(other, ids[2:], "cancelled")
        assert jobs.sweep(ctx, batch_ids=[b.id]).cancelled == [b.id]
        land()
        assert go.is_set() and not stale.is_alive()
        b = other.get_batch(b.id)
        assert b.status == "cancelled"
        assert (b.request_completed, b.request_failed, b.request_cancelled) == (2, 0, 2)
        jobs.sweep(ctx_for(a), batch_ids=[b.id])  # later sweeps leave it alone too
        assert other.get_batch(b.id).request_completed == 2
    finally:
        a.close()
        other.close()


def _age(store, bid, **cols):
    with store.session() as s:
        s.execute(update(BatchRow).where(BatchRow.id == bid).values(**cols))


def test_expiry_keeps_finished_and_expires_the_rest(store):
    b = new_batch(store, lines(5))
    ctx = ctx_for(store)
    jobs.validate_and_enqueue(ctx, b.id)
    ids = [request_id_for(b.id, f"c{i}") for i in range(5)]
    finish(store, ids[:2])
    store.upsert_requests([{"id": ids[2], "status": "running"}])
    _age(store, b.id, expires_at=b.created_at)
    assert jobs.sweep(ctx).expired == [b.id]
    b = store.get_batch(b.id)
    assert b.status == "expired" and b.request_completed == 2 and b.request_expired == 3
    assert ctx.publisher.batch_cancels == [b.id] and ctx.publisher.cancels == []
    assert {r.id: r.status for r in store.list_batch(b.id)} == {
        **{i: "completed" for i in ids[:2]}, **{i: "expired" for i in ids[2:]}}
    out = [orjson.loads(line) for _, line in store.iter_file_lines(b.output_file_id)]
    err = [orjson.loads(line) for _, line in store.iter_file_lines(b.error_file_id)]
    assert [o["custom_id"] for o in out] == ["c0", "c1"]
    assert [(e["custom_id"], e["error"]["code"]) for e in err] == [
        ("c2", "batch_expired"), ("c3", "batch_expired"), ("c4", "batch_expired")]
    # a late final event changes nothing: the expired row stays
    finish(store, ids[3:4])
    assert store.get_request(ids[3]).status == "expired"


def test_validating_batch_expires_without_files(store):
    b = new_batch(store, lines(3))
    _age(store, b.id, expires_at=b.created_at)
    ctx = ctx_for(store)
    assert jobs.validate_and_enqueue(ctx, b.id) == "stopped"  # checks the window first
    assert jobs.sweep(ctx).expired == [b.id]
    b = store.get_batch(b.id)
    assert b.status == "expired" and b.output_file_id is None and ctx.publisher.sent == []


def test_cancel_waits_for_running_requests_then_ends_with_partial_results(store):
    b = new_batch(store, lines(4))
    ctx = ctx_for(store)
    jobs.validate_and_enqueue(ctx, b.id)
    ids = [request_id_for(b.id, f"c{i}") for i in range(4)]
    finish(store, ids[:1])
    b = jobs.cancel_batch(store, ctx.publisher, b.id)
    # one cancel for the whole batch, none per request
    assert b.status == "cancelling" and ctx.publisher.batch_cancels == [b.id]
    assert ctx.publisher.cancels == []
    assert jobs.cancel_batch(store, ctx.publisher, b.id).status == "cancelling"  # idempotent
    assert jobs.sweep(ctx).cancelled == []  # three still open
    finish(store, ids[1:2])                   # finished before the cancel reached it
    finish(store, ids[2:], "cancelled")       # the workers' abort events
    assert jobs.sweep(ctx).cancelled == [b.id]
    b = store.get_batch(b.id)
    assert b.status == "cancelled" and b.cancelled_at is not None
    assert [orjson.loads(x)["custom_id"] for _, x in store.iter_file_lines(b.output_file_id)] == ["c0", "c1"]
    assert [orjson.loads(x)["error"]["code"] for _, x in store.iter_file_lines(b.error_file_id)] == [
        "batch_cancelled"] * 2
    with pytest.raises(StateError):
        done, _ = _ready(store)
        jobs.sweep(ctx)
        jobs.cancel_batch(store, ctx.publisher, done.id)


def test_cancel_grace_ends_requests_nobody_answered(store):
    b = new_batch(store, lines(3))
    ctx = ctx_for(store, batch_cancel_grace_s=0.0)
    jobs.validate_and_enqueue(ctx, b.id)
    jobs.cancel_batch(store, ctx.publisher, b.id)
    assert jobs.sweep(ctx).cancelled == [b.id]
    assert {r.status for r in store.list_batch(b.id)} == {"cancelled"}


def test_cancel_during_enqueue_stops_publishing(store):
    b = new_batch(store, lines(12))
    ctx = ctx_for(store)

    class CancelAfterFirst(Recorder):
        def publish_encoded(self, items, *, topic):
            n = super().publish_encoded(items, topic=topic)
            if self.calls == 1:
                jobs.cancel_batch(store, self, b.id)
            return n

    ctx.publisher = CancelAfterFirst()
    assert jobs.validate_and_enqueue(ctx, b.id) == "stopped"
    first = [rid for rid, _ in ctx.publisher.sent]
    assert len(first) == 4 and ctx.publisher.batch_cancels == [b.id]  # no more published
    # the next chunk's rows (inserted meanwhile, never published) ended `cancelled` at once
    open_rows = [r for r in store.list_batch(b.id) if not r.is_final]
    assert sorted(r.id for r in open_rows) == sorted(first)
    finish(store, first, "cancelled")
    assert jobs.sweep(ctx).cancelled == [b.id]
    b = store.get_batch(b.id)
    errs = [orjson.loads(x) for _, x in store.iter_file_lines(b.error_file_id)]
    assert len(errs) == 12 and {e["error"]["code"] for e in errs} == {"batch_cancelled"}


def test_sweep_sends_a_dead_enqueue_again(store):
    b = new_batch(store, lines(3))
    ctx = ctx_for(store, batch_lease_s=1.0)
    sent = []

    def redispatched():  # this batch only (on Postgres, other tests' batches share the tables)
        return jobs.sweep(ctx, dispatch_enqueue=sent.append, batch_ids=[b.id]).redispatched

    assert redispatched() == []  # fresh: wait
    _age(store, b.id, created_at=b.created_at - timedelta(seconds=5))
    assert store.claim_batch(b.id, "enqueue:dead", ttl_s=60)                  # a live task
    assert redispatched() == []
    _age(store, b.id, lease_until=b.created_at)                               # ...that died
    assert redispatched() == [b.id]
    assert redispatched() == []  # marker holds
    assert sent == [b.id]
    # the task that was sent takes the marker's lease over and does the work
    assert jobs.validate_and_enqueue(ctx, b.id) == "enqueued"
    assert len(ctx.publisher.sent) == 3


def test_anthropic_batch_object_and_results(store):
    body = {"custom_id": "m0", "params": {"max_tokens": 3, "messages": [{"role": "user", "content": "x"}]}}
    f = store.create_file([orjson.dumps(body)], purpose="batch", filename="a.jsonl")
    b = jobs.create_batch(store, input_file_id=f.id, endpoint="/v1/messages")
    ctx = ctx_for(store)
    jobs.validate_and_enqueue(ctx, b.id)
    obj = jobs.anthropic_batch_object(store.get_batch(b.id))
    assert obj["processing_status"] == "in_progress" and obj["request_counts"]["processing"] == 1
    finish(store, [request_id_for(b.id, "m0")])
    jobs.sweep(ctx)
    b = store.get_batch(b.id)
    assert b.status == "completed" and b.error_file_id is None
    obj = jobs.anthropic_batch_object(b, results_url="/v1/messages/batches/x/results")
    assert obj["processing_status"] == "ended" and obj["request_counts"]["succeeded"] == 1
    assert obj["ended_at"].endswith("Z") and obj["results_url"]
    (line,) = [orjson.loads(x) for _, x in store.iter_file_lines(b.output_file_id)]
    assert line["result"]["type"] == "succeeded"
