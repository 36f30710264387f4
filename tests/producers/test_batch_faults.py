"""One bad batch never stops anyone else's: a failure injected into one batch among several
of two owners fails that batch with a readable reason, and the sweep and the enqueue task
go on with the others. And the lines that broke the sweep before (a byte-order mark, a
lone surrogate, bytes that are not UTF-8, NUL) are settled at validation, with the line
number."""

from __future__ import annotations

import dataclasses

import orjson
import pytest

from inflight.producers import batch_jobs as jobs
from inflight.producers import batch_output
from inflight.producers.batch_lines import request_id_for
from inflight.producers.batch_tasks import worker_app
from inflight.producers.celery_app import ENQUEUE_TASK
from inflight.schemas import Settings
from tests.producers.test_batch_jobs import Recorder, ctx_for, finish, lines, new_batch, store  # noqa: F401
from tests.producers.test_batch_jobs import migrated_sqlite  # noqa: F401
from tests.store.local_s3 import local_s3  # noqa: F401 - the store fixture's S3 side


def _owned_batch(store, owner: str, content: list[bytes]):
    f = store.create_file([b"\n".join(content) + b"\n"], purpose="batch", filename="in.jsonl",
                          owner=owner)
    return jobs.create_batch(store, input_file_id=f.id, endpoint="/v1/chat/completions",
                             owner=owner)


def _all_done(store, b, n):
    finish(store, [request_id_for(b.id, f"c{i}") for i in range(n)])


def test_one_batch_that_raises_in_the_sweep_fails_alone(store, monkeypatch):
    ctx = ctx_for(store)
    batches = [_owned_batch(store, owner, lines(3)) for owner in ("alice", "bob", "alice", "bob")]
    for b in batches:
        assert jobs.validate_and_enqueue(ctx, b.id) == "enqueued"
        _all_done(store, b, 3)
    broken = batches[1].id  # bob's first; swept second, between the others
    real = batch_output.write_results

    def write(store_, batch, **kw):
        if batch.id == broken:
            raise RuntimeError("disk on fire")
        return real(store_, batch, **kw)

    monkeypatch.setattr("inflight.producers.batch_sweep.write_results", write)
    report = jobs.sweep(ctx, batch_ids=[b.id for b in batches])
    assert report.failed == [broken]
    assert sorted(report.completed) == sorted(b.id for b in batches if b.id != broken)
    rows = {b.id: store.get_batch(b.id) for b in batches}
    assert {bid: r.status for bid, r in rows.items()} == {
        b.id: "failed" if b.id == broken else "completed" for b in batches}
    err = rows[broken].errors[0]
    assert err["code"] == "batch_processing_error" and "disk on fire" in err["message"]
    assert jobs.batch_object(rows[broken])["errors"]["data"][0]["message"] == err["message"]
    # the others' output files are whole
    for b in batches:
        if b.id != broken:
            out = list(store.iter_file_lines(rows[b.id].output_file_id))
            assert len(out) == 3
    assert jobs.sweep(ctx, batch_ids=[b.id for b in batches]).failed == []  # it stays ended


def test_a_row_that_cannot_be_formatted_fails_that_request_only(store, monkeypatch):
    ctx = ctx_for(store)
    b = _owned_batch(store, "alice", lines(3))
    jobs.validate_and_enqueue(ctx, b.id)
    _all_done(store, b, 3)
    bad = request_id_for(b.id, "c1")
    real = batch_output.openai_line

    def line(custom_id, rid, row, **kw):
        if rid == bad:
            raise KeyError("usage")
        return real(custom_id, rid, row, **kw)

    monkeypatch.setattr(batch_output, "openai_line", line)
    assert jobs.sweep(ctx, batch_ids=[b.id]).completed == [b.id]
    b = store.get_batch(b.id)
    assert b.request_counts == {"total": 3, "completed": 2, "failed": 1}
    err = [orjson.loads(x) for _, x in store.iter_file_lines(b.error_file_id)]
    assert [(e["custom_id"], e["response"]["body"]["error"]["code"]) for e in err] == [
        ("c1", "result_unwritable")]


def test_the_enqueue_task_fails_the_batch_that_raises(store, monkeypatch):
    objects = getattr(store, "objects", None)   # the S3 side, when the store has one
    files = {"files_url": objects.url, "files_s3_endpoint": store.files_endpoint} if objects else {}
    settings = Settings(database_url=store.url, batch_enqueue_chunk=4, **files)
    app = worker_app(settings, model_name="tiny")
    good, bad = _owned_batch(store, "alice", lines(2)), _owned_batch(store, "bob", lines(2))
    real = jobs.validate_and_enqueue

    def validate(ctx, batch_id):
        if batch_id == bad.id:
            raise TypeError("a bug in one batch")
        return real(dataclasses.replace(ctx, publisher=Recorder()), batch_id)  # no Kafka here

    monkeypatch.setattr("inflight.producers.batch_tasks.validate_and_enqueue", validate)
    task = app.tasks[ENQUEUE_TASK]
    assert task.apply(args=[bad.id]).get() == "failed"
    assert task.apply(args=[good.id]).get() == "enqueued"
    b = store.get_batch(bad.id)
    assert b.status == "failed" and "a bug in one batch" in b.errors[0]["message"]
    assert store.get_batch(good.id).status == "in_progress"
    app.inflight_resources.close()


BOM = b"\xef\xbb\xbf"


def test_a_byte_order_mark_is_dropped_and_the_batch_completes(store):
    ctx = ctx_for(store)
    b = _owned_batch(store, "alice", [BOM + lines(1)[0], *lines(2, 1)])
    assert jobs.validate_and_enqueue(ctx, b.id) == "enqueued"
    _all_done(store, b, 3)
    assert jobs.sweep(ctx, batch_ids=[b.id]).completed == [b.id]
    b = store.get_batch(b.id)
    out = [orjson.loads(x) for _, x in store.iter_file_lines(b.output_file_id)]
    assert [o["custom_id"] for o in out] == ["c0", "c1", "c2"]


@pytest.mark.parametrize("line, code_word, param", [
    (b'{"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": '
     b'[{"role": "user", "content": "\\ud800"}]}}', "surrogate", "body.messages.0.content"),
    (b'{"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": '
     b'[{"role": "user", "content": "\xff\xfe"}]}}', "UTF-8", None),
    (b'{"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": '
     b'[{"role": "user", "content": "a\\u0000b"}]}}', "NUL", "body.messages.0.content"),
    (b'{"custom_id": "x\\udc00", "method": "POST", "url": "/v1/chat/completions", "body": {}}',
     "surrogate", "custom_id"),
    (b'{"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": {"\\ud800": 1}}',
     "surrogate", "body.\\ud800"),
    ('{"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": {}}'
     .encode("utf-16-le"), "UTF-16", None),
], ids=["lone-surrogate", "not-utf8", "nul", "surrogate-in-custom-id", "surrogate-in-a-key",
        "utf-16"])
def test_lines_that_cannot_be_stored_fail_validation_with_their_number(store, line, code_word,
                                                                       param):
    ctx = ctx_for(store)
    b = _owned_batch(store, "bob", [*lines(1), line])
    assert jobs.validate_and_enqueue(ctx, b.id) == "failed"
    err = store.get_batch(b.id).errors
    assert [e["line"] for e in err] == [2] and code_word in err[0]["message"], err
    assert err[0]["param"] == param
    assert ctx.publisher.sent == []
    orjson.dumps(jobs.batch_object(store.get_batch(b.id)))  # what GET /v1/batches/{id} sends


def test_a_refused_message_batch_reports_each_request_errored(store):
    """Anthropic reports a batch's bad requests per request: a /v1/messages batch that
    fails validation ends with a results file, every request `errored` with its reason."""
    def msg(cid, max_tokens):
        return orjson.dumps({"custom_id": cid, "params": {"model": "default", "max_tokens": max_tokens,
                                                          "messages": [{"role": "user",
                                                                        "content": "hi"}]}})

    f = store.create_file([msg("a", 4) + b"\n" + msg("b", 5000) + b"\n" + msg("c", 4) + b"\n"],
                          purpose="batch", filename="in.jsonl", owner="carol")
    b = jobs.create_batch(store, input_file_id=f.id, endpoint="/v1/messages", owner="carol")
    assert jobs.validate_and_enqueue(ctx_for(store), b.id) == "failed"
    b = store.get_batch(b.id)
    obj = jobs.anthropic_batch_object(b, results_url="/r")
    assert obj["processing_status"] == "ended" and obj["results_url"] == "/r"
    assert obj["request_counts"]["errored"] == 3
    results = [orjson.loads(x) for _, x in store.iter_file_lines(b.output_file_id)]
    assert [r["custom_id"] for r in results] == ["a", "b", "c"]
    assert {r["result"]["type"] for r in results} == {"errored"}
    texts = [r["result"]["error"]["error"]["message"] for r in results]
    assert "context of 512" in texts[1] and texts[0].startswith("not run") and "line 2" in texts[0]


@pytest.mark.parametrize("end", ["cancel", "expire"])
def test_a_message_batch_ended_before_it_ran_reports_each_request(store, end):
    """Cancelled (or expired) while validating: Anthropic's clients read an ended batch's
    results, so every request is there, canceled or expired (not an ended batch with all
    counts 0 and no results)."""
    rows = [orjson.dumps({"custom_id": f"m{i}", "params": {"max_tokens": 3, "messages": [
        {"role": "user", "content": "x"}]}}) for i in range(2)]
    f = store.create_file([b"\n".join(rows) + b"\n"], purpose="batch", filename="a.jsonl")
    b = jobs.create_batch(store, input_file_id=f.id, endpoint="/v1/messages")
    ctx = ctx_for(store)
    if end == "cancel":
        jobs.cancel_batch(store, ctx.publisher, b.id)
    else:
        from tests.producers.test_batch_jobs import _age
        _age(store, b.id, expires_at=b.created_at)
    jobs.sweep(ctx, batch_ids=[b.id])
    b = store.get_batch(b.id)
    assert b.status == ("cancelled" if end == "cancel" else "expired")
    obj = jobs.anthropic_batch_object(b, results_url="/x")
    kind = "canceled" if end == "cancel" else "expired"
    assert obj["processing_status"] == "ended" and obj["results_url"] == "/x"
    assert obj["request_counts"][kind] == 2
    out = [orjson.loads(x) for _, x in store.iter_file_lines(b.output_file_id)]
    assert [(o["custom_id"], o["result"]["type"]) for o in out] == [("m0", kind), ("m1", kind)]


def test_a_batch_whose_input_file_went_fails_instead_of_waiting(store):
    """A file deleted between the batch's create and its validation (the API's 409 for a
    file an open batch reads cannot see a batch not created yet): the enqueue task used
    to answer "not found" and leave it `validating`, sent again by every sweep."""
    app = worker_app(Settings(database_url=store.url), model_name="tiny")
    b = _owned_batch(store, "alice", lines(2))
    store.delete_file(b.input_file_id)
    assert app.tasks[ENQUEUE_TASK].apply(args=[b.id]).get() == "failed"
    b = store.get_batch(b.id)
    assert b.status == "failed" and "not found" in b.errors[0]["message"], b.errors
    assert app.tasks[ENQUEUE_TASK].apply(args=["batch_gone"]).get() == "not found"
    app.inflight_resources.close()
