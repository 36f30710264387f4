"""Idempotent upserts and lookups, on SQLite and Postgres."""

from __future__ import annotations

import threading
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inflight.schemas import ErrorEvent, FinalEvent, InferenceRequest, StoreError, Timings, Usage
from inflight.store import STATUS_RANK, STATUSES, Store, error_row, final_row, queued_row, running_row


def final(rid: str, text: str, **kw):
    return {"id": rid, "status": "completed", "output": text, "finish_reason": "stop", **kw}


def test_insert_then_move_forward(store: Store):
    req = InferenceRequest(request_id="r1", prompt="hello", batch_id="b1")
    store.upsert_requests([queued_row(req)])
    row = store.get_request("r1")
    assert row.status == "queued" and row.prompt == "hello" and row.batch_id == "b1"
    assert row.params["max_tokens"] == req.params.max_tokens and row.attempts == 0
    assert row.created_at.tzinfo is not None

    store.upsert_requests([running_row("r1", worker="w0", started_at=1.0e9)])
    row = store.get_request("r1")
    assert (row.status, row.worker, row.attempts) == ("running", "w0", 1)
    assert row.started_at == datetime.fromtimestamp(1.0e9, timezone.utc)

    ev = FinalEvent(request_id="r1", text="hi there", token_ids=[5, 6], finish_reason="length",
                    usage=Usage(prompt_tokens=2, completion_tokens=2),
                    timings=Timings(queued_at=1.0e9, finished_at=1.0e9 + 2), worker="w0")
    store.upsert_requests([final_row(ev)])
    row = store.get_request("r1")
    assert row.status == "completed" and row.finish_reason == "length" and row.is_final
    assert row.output == "hi there" and row.output_token_ids == [5, 6]
    assert row.usage["completion_tokens"] == 2 and row.timings["finished_at"] == 1.0e9 + 2
    assert row.prompt == "hello" and row.batch_id == "b1"  # NULLs in the final don't erase
    assert row.attempts == 1 and row.updated_at >= row.created_at


def test_attempts_count_each_admission_once(store: Store):
    """Each status event (an admission by a worker) counts one attempt; a replayed one
    (the recorder restarted before its commit) counts none, in any batching."""
    rid = f"att-{uuid.uuid4().hex[:8]}"
    t1, t2, t3 = 1.0e9, 1.0e9 + 30, 1.0e9 + 61
    ev = FinalEvent(request_id=rid, text="x", finish_reason="stop", worker="w2")
    store.upsert_requests([running_row(rid, worker="w0", started_at=t1)])
    store.upsert_requests([running_row(rid, worker="w0", started_at=t1)])  # replayed
    assert store.get_request(rid).attempts == 1
    # worker w0 died: w1 runs it again, the recorder reads both in one batch, twice
    batch = [running_row(rid, worker="w0", started_at=t1),
             running_row(rid, worker="w1", started_at=t2), final_row(ev)]
    store.upsert_requests(batch)
    store.upsert_requests(batch)
    row = store.get_request(rid)
    assert (row.status, row.attempts) == ("completed", 2)
    # ran once more after its final was written (a duplicate run): counted, final kept
    store.upsert_requests([running_row(rid, worker="w3", started_at=t3), final_row(ev)])
    row = store.get_request(rid)
    assert (row.status, row.attempts, row.worker) == ("completed", 3, "w2")
    # a fresh id whose two attempts and final all arrive in one batch
    other = f"att2-{uuid.uuid4().hex[:8]}"
    store.upsert_requests([running_row(other, started_at=t1), running_row(other, started_at=t2),
                           running_row(other, started_at=t1),
                           final_row(ev.model_copy(update={"request_id": other}))])
    assert store.get_request(other).attempts == 2


def test_duplicate_final_does_not_overwrite(store: Store):
    store.upsert_requests([final("r", "first")])
    store.upsert_requests([final("r", "second")])
    store.upsert_requests([{"id": "r", "status": "failed", "error": "late"}])
    row = store.get_request("r")
    assert (row.status, row.output, row.error) == ("completed", "first", None)


@pytest.mark.parametrize("late", ["queued", "running"])
def test_late_queued_or_running_never_downgrades(store: Store, late):
    store.upsert_requests([final("r", "done")])
    store.upsert_requests([{"id": "r", "status": late, "worker": "late-worker", "attempts": 5}])
    row = store.get_request("r")
    assert (row.status, row.output, row.worker) == ("completed", "done", None)
    store.upsert_requests([{"id": "q", "status": "running", "worker": "w1"}])
    store.upsert_requests([{"id": "q", "status": "queued", "prompt": "late", "worker": "w2"}])
    row = store.get_request("q")
    # a late row only fills describing columns that were missing; status/worker stay
    assert (row.status, row.worker, row.prompt) == ("running", "w1", "late")


def test_final_before_queued_keeps_the_prompt_and_never_replaces_it(store: Store):
    """The recorder may see the final event before the queued one (different topics)."""
    store.upsert_requests([final("fq", "answer")])
    queued = {"id": "fq", "status": "queued", "prompt": "question", "params": {"max_tokens": 4},
              "batch_id": "b1", "worker": "nobody"}
    store.upsert_requests([queued])
    row = store.get_request("fq")
    assert (row.status, row.output, row.worker) == ("completed", "answer", None)
    assert (row.prompt, row.params, row.batch_id) == ("question", {"max_tokens": 4}, "b1")
    store.upsert_requests([queued | {"prompt": "other", "params": {"max_tokens": 9}}])
    row = store.get_request("fq")
    assert (row.prompt, row.params) == ("question", {"max_tokens": 4})
    # the same order inside one batch folds the same way
    store.upsert_requests([final("fq2", "answer"), queued | {"id": "fq2"}])
    row = store.get_request("fq2")
    assert (row.status, row.output, row.prompt) == ("completed", "answer", "question")


@pytest.mark.parametrize("batched", [False, True])
def test_second_submission_of_an_id_keeps_the_first_prompt_and_params(store: Store, batched):
    """The request_id is the idempotency key: the worker runs the first submission, so a
    second one with another prompt must not replace what the row says ran."""
    first = queued_row(InferenceRequest(request_id="twice", prompt="first prompt", batch_id="b1",
                                        params={"max_tokens": 4}))
    second = queued_row(InferenceRequest(request_id="twice", prompt="second prompt",
                                         batch_id="b2", priority=5, params={"max_tokens": 9}))
    ev = FinalEvent(request_id="twice", text="out", finish_reason="stop", batch_id="b2")
    rows = [first, second, running_row("twice", worker="w"), second, final_row(ev), second]
    if batched:
        store.upsert_requests(rows)
    else:
        for row in rows:
            store.upsert_requests([row])
    row = store.get_request("twice")
    assert (row.status, row.output, row.worker) == ("completed", "out", "w")
    assert (row.prompt, row.params["max_tokens"], row.batch_id, row.priority) == (
        "first prompt", 4, "b1", 0)


def test_batched_mixed_rows_in_one_call(store: Store):
    rows = [{"id": f"m{i}", "status": "queued", "batch_id": "mix", "prompt": f"p{i}"}
            for i in range(1200)]  # spans several INSERT statements
    rows += [final("m1", "one"), {"id": "m1", "status": "running"},  # same id twice: final stays
             final("m2", "two-a"), final("m2", "two-b"),            # first final wins
             {"id": "m3", "status": "running", "worker": "w"},
             {"id": "m4", "status": "cancelled", "finish_reason": "abort"}]
    assert store.upsert_requests(rows) == 1200
    got = store.get_requests(["m0", "m1", "m2", "m3", "m4", "nope"])
    assert set(got) == {"m0", "m1", "m2", "m3", "m4"}
    assert got["m1"].status == "completed" and got["m1"].prompt == "p1"
    assert got["m2"].output == "two-a"
    assert got["m3"].status == "running" and got["m4"].status == "cancelled"
    # replaying the whole batch (at-least-once delivery) changes nothing
    before = {r.id: (r.status, r.output) for r in store.list_batch("mix", limit=5000)}
    store.upsert_requests(rows)
    after = {r.id: (r.status, r.output) for r in store.list_batch("mix", limit=5000)}
    assert before == after
    counts = store.count_by_status("mix")
    assert counts == {"queued": 1196, "running": 1, "completed": 2, "failed": 0,
                      "cancelled": 1, "expired": 0}


def test_get_list_count(store: Store):
    assert store.get_request("missing") is None
    assert store.count_by_status() == dict.fromkeys(STATUSES, 0)
    store.upsert_requests([{"id": f"a{i:02d}", "status": "queued", "batch_id": "A"} for i in range(5)]
                          + [{"id": "b0", "status": "queued", "batch_id": "B"},
                             {"id": "solo", "status": "running"}])
    store.upsert_requests([final("a01", "x"), {"id": "a02", "status": "failed", "error": "boom"}])
    page1 = store.list_batch("A", limit=3)
    assert [r.id for r in page1] == ["a00", "a01", "a02"]
    assert [r.id for r in store.list_batch("A", after=page1[-1].id)] == ["a03", "a04"]
    assert [r.id for r in store.list_batch("A", status="completed")] == ["a01"]
    assert [r.id for r in store.list_batch("A", status=["failed", "completed"])] == ["a01", "a02"]
    assert store.count_by_status("A")["queued"] == 3
    total = store.count_by_status()
    assert (total["queued"], total["running"], total["completed"], total["failed"]) == (4, 1, 1, 1)


def test_error_rows(store: Store):
    store.upsert_requests([error_row(ErrorEvent(request_id="e1", code="invalid_request",
                                                message="params.top_p: bad"))])
    store.upsert_requests([error_row(ErrorEvent(request_id="e2", code="cancelled", message="by user"))])
    e1, e2 = store.get_request("e1"), store.get_request("e2")
    assert (e1.status, e1.error_code, e1.finish_reason) == ("failed", "invalid_request", "error")
    assert e1.finished_at is not None and e2.status == "cancelled"
    with pytest.raises(ValueError):
        error_row(ErrorEvent(request_id=None, code="invalid_request", message="x"))


def test_concurrent_duplicate_finals_first_wins(db_url):
    # two Store objects = two connection pools, like two recorder processes
    a, b = Store(db_url, create=True), Store(db_url)
    try:
        for attempt in range(5):
            rid = f"race-{attempt}"
            a.upsert_requests([{"id": rid, "status": "running"}])
            barrier = threading.Barrier(2)
            errors = []

            def write(s, text):
                try:
                    barrier.wait()
                    s.upsert_requests([final(rid, text)])
                except Exception as e:  # noqa: BLE001
                    errors.append(e)

            threads = [threading.Thread(target=write, args=(s, t)) for s, t in ((a, "A"), (b, "B"))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert not errors
            row = a.get_request(rid)
            assert row.status == "completed" and row.output in ("A", "B")
            # whichever committed first stays; a third writer changes nothing
            b.upsert_requests([final(rid, "C")])
            assert a.get_request(rid).output == row.output
    finally:
        a.close()
        b.close()


def test_bad_rows_are_rejected(store: Store):
    with pytest.raises(ValueError):
        store.upsert_requests([{"id": "r", "status": "done"}])
    with pytest.raises(ValueError):
        store.upsert_requests([{"id": "r", "status": "queued", "colour": "red"}])
    assert store.upsert_requests([]) == 0


def test_unreachable_database_raises_store_error(tmp_path):
    s = Store("postgresql://postgres@127.0.0.1:1/nowhere")  # also: plain postgresql:// → psycopg
    with pytest.raises(StoreError, match="unreachable"):
        s.get_request("r")
    s.close()
    s = Store(f"sqlite:///{tmp_path}/no/such/dir/x.db")
    with pytest.raises(StoreError, match="retried"):
        s.upsert_requests([{"id": "r", "status": "queued"}])
    s.close()


_STATUS_SEQ = st.lists(st.tuples(st.sampled_from(STATUSES), st.integers(0, 9)), min_size=1, max_size=8)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(seq=_STATUS_SEQ, batched=st.booleans())
def test_any_order_of_updates_ends_in_the_first_final(store: Store, seq, batched):
    """Model: status only climbs ranks; the first final row written is the one kept."""
    rid = f"prop-{uuid.uuid4().hex[:12]}"
    rows = [{"id": rid, "status": s, "output": f"{s}-{n}"} for s, n in seq]
    if batched:
        store.upsert_requests(rows)
    else:
        for row in rows:
            store.upsert_requests([row])
    expect = None
    for row in rows:
        if expect is None or STATUS_RANK[row["status"]] > STATUS_RANK[expect["status"]] or (
                STATUS_RANK[row["status"]] == STATUS_RANK[expect["status"]] < 2):
            expect = row
    got = store.get_request(rid)
    assert (got.status, got.output) == (expect["status"], expect["output"])


def test_a_value_too_long_for_its_column_is_refused_not_cut(store: Store):
    """Postgres' unnest upsert must not cast its arrays to VARCHAR(n)[] (an explicit cast
    cuts a long value silently); the column refuses it, as every other write path does."""
    if store.dialect != "postgresql":
        pytest.skip("SQLite does not enforce VARCHAR lengths")
    with pytest.raises(StoreError):
        store.upsert_requests([final("long-worker", "x", worker="w" * 300)])
    assert store.get_request("long-worker") is None
    store.upsert_requests([final("ok-worker", "x", worker="w" * 256)])
    assert store.get_request("ok-worker").worker == "w" * 256


@pytest.mark.parametrize("text", ["plain", "a\x00b", "\x00", "x\uffff0y\x00\uffff1\uffff",
                                  "\ufffd\x00\uffff\uffff"])
def test_final_text_is_stored_exactly_nul_included(store: Store, text: str):
    """The stored text is the final event's, NUL characters too (Postgres text cannot hold
    them: the column escapes them, store/models.ExactText), through every reader."""
    from inflight.store.rows import clean_row

    rid = f"nul-{uuid.uuid4().hex[:8]}"
    ev = FinalEvent(request_id=rid, text=text, token_ids=[0, 5], finish_reason="length",
                    usage=Usage(prompt_tokens=2, completion_tokens=2),
                    timings=Timings(queued_at=1.0e9, finished_at=1.0e9 + 2), worker="w0")
    store.upsert_requests([clean_row(final_row(ev))])  # as the recorder writes it
    assert store.get_request(rid).output == text
    assert store.result_rows([rid])[rid]["output"] == text
