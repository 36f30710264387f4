"""Grouped submits (api/group_commit.py) serve many owners at once: a row the database
refuses fails only the submit that carried it, the others of its group are filed; a
database that is away fails the group as before. Real databases, a real refusal (a
trigger), SQLite and Postgres."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from inflight.api.group_commit import ClaimQueue
from inflight.api.metrics import ApiMetrics
from inflight.schemas import InferenceRequest
from inflight.schemas.errors import StoreError
from inflight.store import Store, queued_row
from tests.api.test_group_read import on_thread
from tests.consumers.test_recorder_edges import refusing_rows_with


@pytest.fixture
def store(db_url):
    with Store(db_url, create=True) as s:
        yield s


def test_one_refused_row_fails_only_its_submit(store):
    tag, marker = uuid.uuid4().hex[:8], f"refuse-{uuid.uuid4().hex[:6]}"
    rows = [(queued_row(InferenceRequest(request_id=f"{tag}-{i}",
                                         prompt=marker if i == 3 else f"p{i}")), f"owner{i % 2}")
            for i in range(8)]
    metrics = ApiMetrics(0)
    claims = ClaimQueue(store, on_thread, metrics)

    async def main():
        return await asyncio.gather(*[claims.claim(row, owner) for row, owner in rows],
                                    return_exceptions=True)

    with refusing_rows_with(store, marker):
        results = asyncio.run(main())
    assert metrics.values["submit_groups"] == 1  # they shared one group, which was refused
    assert isinstance(results[3], StoreError)
    assert [r for i, r in enumerate(results) if i != 3] == [None] * 7  # filed, each of them
    for i, (row, owner) in enumerate(rows):
        got = store.get_request(row["id"])
        assert (got is None) if i == 3 else (got.owner == owner), i


def test_a_database_that_is_away_fails_the_group(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'gone' / 'x.db'}")  # its folder does not exist
    claims = ClaimQueue(store, on_thread, ApiMetrics(0))
    rows = [queued_row(InferenceRequest(request_id=f"r{i}", prompt="x")) for i in range(3)]

    async def main():
        return await asyncio.gather(*[claims.claim(r, "o") for r in rows],
                                    return_exceptions=True)

    assert all(isinstance(r, StoreError) for r in asyncio.run(main()))
    store.close()
