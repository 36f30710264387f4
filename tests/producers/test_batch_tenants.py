"""Batches and tenants on the real store (SQLite and Postgres): lines inherit the batch's
owner as their tenant and its completion window as their deadline; a batch over its owner's
queued-token limit fails validation saying so."""

from __future__ import annotations

import shutil

import orjson
import pytest

from inflight.api.keys import create_key
from inflight.producers import batch_jobs as jobs
from inflight.schemas import decode_request
from inflight.store import Store
from tests.producers.test_batch_jobs import CHAT, ctx_for, migrated_sqlite  # noqa: F401


@pytest.fixture
def store(db_url, migrated_sqlite):  # noqa: F811 - files in the database (no S3 here)
    if db_url.startswith("sqlite"):
        shutil.copy(migrated_sqlite, db_url.removeprefix("sqlite:///"))
        s = Store(db_url)
    else:
        s = Store(db_url, create=True)
    yield s
    s.close()


def _batch(store, n: int, owner: str, max_tokens: int = 4):
    content = [orjson.dumps({"custom_id": f"c{i}", "method": "POST", "url": CHAT,
                             "body": {"messages": [{"role": "user", "content": "abcdefgh"}],
                                      "max_tokens": max_tokens}}) for i in range(n)]
    f = store.create_file([b"\n".join(content) + b"\n"], purpose="batch", filename="in.jsonl")
    return jobs.create_batch(store, input_file_id=f.id, endpoint=CHAT, owner=owner,
                             completion_window="1h")


def test_lines_inherit_owner_and_window(store):
    b = _batch(store, 3, "team-a")
    ctx = ctx_for(store)
    assert jobs.validate_and_enqueue(ctx, b.id) == "enqueued"
    req = decode_request(ctx.publisher.sent[0][1])
    assert req.tenant == "team-a"
    assert abs(req.deadline - store.get_batch(b.id).expires_at.timestamp()) < 1e-3
    assert {r.tenant for r in store.list_batch(b.id)} == {"team-a"}


def test_a_batch_over_the_queued_token_limit_fails_validation(store):
    create_key(store, "k", owner="team-q", max_queued_tokens=100)
    ctx = ctx_for(store)
    first = _batch(store, 4, "team-q", max_tokens=10)  # 4 x (2 prompt + 10) = 48 tokens
    assert jobs.validate_and_enqueue(ctx, first.id) == "enqueued"
    assert store.get_batch(first.id).queued_tokens == 48
    second = _batch(store, 5, "team-q", max_tokens=10)  # 60 more: 108 > 100
    assert jobs.validate_and_enqueue(ctx, second.id) == "failed"
    err = store.get_batch(second.id).errors[0]
    assert err["code"] == "token_limit_exceeded"
    assert "60 tokens" in err["message"] and "hold 48" in err["message"]
    assert "limit is 100" in err["message"]
    third = _batch(store, 4, "team-q", max_tokens=10)  # 48 more: 96 fits
    assert jobs.validate_and_enqueue(ctx, third.id) == "enqueued"
    other = _batch(store, 20, "team-other", max_tokens=10)  # another owner: no limit
    assert jobs.validate_and_enqueue(ctx, other.id) == "enqueued"
