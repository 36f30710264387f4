"""Grouped poll reads (api/group_read.py): concurrent lookups share one SELECT, each gets
its own row, and a failed read reaches every lookup of its group."""

from __future__ import annotations

import asyncio

from anyio import to_thread

from inflight.api.group_read import ViewQueue
from inflight.api.metrics import ApiMetrics
from inflight.schemas import FinalEvent, InferenceRequest
from inflight.schemas.errors import StoreError
from inflight.store import Store, final_row, queued_row
from tests.store.owner_rows import claim_request


async def on_thread(fn, *args):
    return await to_thread.run_sync(fn, *args)


def test_concurrent_lookups_share_one_select(tmp_path):
    with Store(f"sqlite:///{tmp_path / 'v.db'}", create=True) as store:
        for i in range(20):
            claim_request(store, queued_row(InferenceRequest(request_id=f"r{i}", prompt="x")),
                          f"o{i % 3}")
        store.upsert_requests([final_row(FinalEvent(request_id="r7", text="hi",
                                                    finish_reason="stop"))])
        metrics = ApiMetrics(0)
        views = ViewQueue(store, on_thread, metrics)
        ids = [f"r{i}" for i in range(20)] + ["r7", "missing"]

        async def main():
            first = await asyncio.gather(*[views.view(rid) for rid in ids])
            alone = await views.view("r3")
            return first, alone

        first, alone = asyncio.run(main())
    # all asked before the reader ran: one group; then a lone lookup is its own group
    assert metrics.values["poll_groups"] == 2
    assert [v.id if v else None for v in first] == ids[:-1] + [None]
    assert [v.owner for v in first[:20]] == [f"o{i % 3}" for i in range(20)]
    assert first[7].output == first[20].output == "hi" and first[3].status == "queued"
    assert alone.id == "r3"


def test_a_failed_read_fails_every_lookup_of_the_group(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'v.db'}", create=True)
    store.close()
    failing = Store(f"sqlite:///{tmp_path / 'gone' / 'v.db'}")  # its folder does not exist
    views = ViewQueue(failing, on_thread, ApiMetrics(0))

    async def main():
        return await asyncio.gather(*[views.view(f"r{i}") for i in range(3)],
                                    return_exceptions=True)

    got = asyncio.run(main())
    failing.close()
    assert len(got) == 3 and all(isinstance(e, StoreError) for e in got), got
