"""Batch rows: forward-only atomic transitions, leases, listing, counts (SQLite + Postgres)."""

from __future__ import annotations

import threading
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from inflight.schemas import NotFoundError, StoreError
from inflight.store import BATCH_PREDECESSORS, BATCH_STATUSES, Store


def new(store: Store, bid: str | None = None, **kw) -> str:
    bid = bid or f"batch_{uuid.uuid4().hex[:8]}"
    store.create_batch(bid, endpoint="/v1/chat/completions", input_file_id="file-x", **kw)
    return bid


def test_create_is_idempotent_and_carries_the_openai_fields(store: Store):
    exp = datetime.now(timezone.utc) + timedelta(hours=24)
    bid = new(store, "batch_a", expires_at=exp, metadata={"k": "v"}, owner="team-1")
    b = store.create_batch("batch_a", endpoint="/v1/completions", input_file_id="other")
    assert (b.status, b.endpoint, b.input_file_id, b.completion_window) == \
        ("validating", "/v1/chat/completions", "file-x", "24h")
    assert b.meta == {"k": "v"} and b.owner == "team-1" and bid == "batch_a"
    assert abs((b.expires_at - exp).total_seconds()) < 1e-3
    assert b.request_counts == {"total": 0, "completed": 0, "failed": 0}
    with pytest.raises(NotFoundError):
        store.require_batch("batch_nope")
    with pytest.raises(ValueError):
        store.create_batch("batch_b", endpoint="/v1/x", input_file_id=None, status="queued")


def test_every_transition_moves_only_forward(store: Store):
    # from each status, try every target: exactly the allowed ones succeed, each once
    for start in BATCH_STATUSES:
        for target in BATCH_PREDECESSORS:
            bid = new(store)
            _drive_to(store, bid, start)
            ok = store.transition_batch(bid, target)
            assert ok == (start in BATCH_PREDECESSORS[target]), (start, target)
            row = store.get_batch(bid)
            assert row.status == (target if ok else start)
            if ok:
                assert getattr(row, f"{target}_at") is not None
                assert store.transition_batch(bid, target) is False  # second time: no-op
    with pytest.raises(ValueError):
        store.transition_batch(new(store), "validating")
    with pytest.raises(ValueError):
        store.transition_batch(new(store), "in_progress", status="completed")


_PATH = {"validating": [], "in_progress": ["in_progress"], "failed": ["failed"],
         "finalizing": ["in_progress", "finalizing"],
         "completed": ["in_progress", "finalizing", "completed"],
         "expired": ["in_progress", "expired"], "cancelling": ["in_progress", "cancelling"],
         "cancelled": ["in_progress", "cancelling", "cancelled"]}


def _drive_to(store: Store, bid: str, status: str) -> None:
    for step in _PATH[status]:
        assert store.transition_batch(bid, step)


def test_racing_transitions_have_one_winner(db_url):
    """Eight threads, each with its own engine (own connections), race in_progress ->
    finalizing on the same rows: every row is moved by exactly one of them."""
    stores = [Store(db_url, create=True) for _ in range(8)]
    try:
        ids = [new(stores[0]) for _ in range(20)]
        for bid in ids:
            stores[0].transition_batch(bid, "in_progress")
        wins: list[list[str]] = [[] for _ in stores]
        barrier = threading.Barrier(len(stores))

        def race(i: int) -> None:
            barrier.wait()
            for bid in ids:
                if stores[i].transition_batch(bid, "finalizing", output_file_id=f"f{i}"):
                    wins[i].append(bid)

        threads = [threading.Thread(target=race, args=(i,)) for i in range(len(stores))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(b for w in wins for b in w) == sorted(ids)
        for i, w in enumerate(wins):
            for bid in w:
                assert stores[0].get_batch(bid).output_file_id == f"f{i}"
    finally:
        for s in stores:
            s.close()


def test_lease_is_exclusive_until_released_or_expired(store: Store):
    bid = new(store)
    assert store.claim_batch(bid, "sweeper-1", ttl_s=60)
    assert store.claim_batch(bid, "sweeper-1", ttl_s=60)  # extend own lease
    assert not store.claim_batch(bid, "sweeper-2", ttl_s=60)
    assert store.transition_batch(bid, "in_progress")
    # a lease-bound transition only works for the holder
    assert not store.transition_batch(bid, "finalizing", lease_owner="sweeper-2")
    assert store.transition_batch(bid, "finalizing", lease_owner="sweeper-1")
    store.release_batch(bid, "sweeper-2")  # not the holder: nothing happens
    assert not store.claim_batch(bid, "sweeper-2", ttl_s=60)
    store.release_batch(bid, "sweeper-1")
    assert store.claim_batch(bid, "sweeper-2", ttl_s=-1)  # already expired lease
    assert store.claim_batch(bid, "sweeper-3", ttl_s=60)
    # a final status clears the lease
    assert store.transition_batch(bid, "completed", lease_owner="sweeper-3")
    assert store.get_batch(bid).lease_owner is None


def test_progress_fields_and_counts(store: Store):
    bid = new(store)
    assert store.set_batch_fields(bid, lines_validated=10, request_total=3)
    assert not store.set_batch_fields(bid, only_if_status=["in_progress"], lines_enqueued=3)
    with pytest.raises(ValueError):
        store.set_batch_fields(bid, status="completed")
    rows = [{"id": f"{bid}:a", "status": "completed", "batch_id": bid, "custom_id": "a"},
            {"id": f"{bid}:b", "status": "failed", "batch_id": bid, "custom_id": "b"},
            {"id": f"{bid}:c", "status": "expired", "batch_id": bid, "custom_id": "c"},
            {"id": f"{bid}:d", "status": "queued", "batch_id": bid, "custom_id": "d"}]
    store.insert_requests(rows)
    store.insert_requests([{"id": f"{bid}:a", "status": "queued", "batch_id": bid}])  # kept
    assert store.get_request(f"{bid}:a").status == "completed"
    assert store.get_request(f"{bid}:d").custom_id == "d"
    b = store.refresh_batch_counts(bid)
    assert (b.lines_validated, b.request_total, b.request_completed, b.request_failed,
            b.request_expired, b.request_cancelled, b.request_done) == (10, 3, 1, 1, 1, 0, 3)
    # an ended batch keeps the counts it ended with (set by the sweep that ended it)
    store.transition_batch(bid, "in_progress")
    assert store.transition_batch(bid, "cancelling")
    assert store.transition_batch(bid, "cancelled", request_completed=1, request_cancelled=2)
    store.upsert_requests([{"id": f"{bid}:d", "status": "completed"}])
    b = store.refresh_batch_counts(bid)
    assert (b.request_completed, b.request_cancelled) == (1, 2)


def test_insert_requests_in_bulk(store: Store):
    """The enqueue's rows: as many as a chunk, some already stored (kept as they are); on
    Postgres one array per column (an overlong value is refused, not cut)."""
    bid = new(store)
    at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    store.insert_requests([{"id": f"{bid}:0", "status": "completed", "batch_id": bid}])
    store.insert_requests([{"id": f"{bid}:{i}", "batch_id": bid, "custom_id": f"c{i}",
                            "owner": None if i % 2 else "o", "priority": 10,
                            "created_at": at} for i in range(1200)])
    rows = {r.id: r for r in store.list_batch(bid, limit=2000)}
    assert len(rows) == 1200 and rows[f"{bid}:0"].status == "completed"
    r = rows[f"{bid}:7"]
    assert (r.status, r.custom_id, r.owner, r.priority, r.created_at, r.attempts) == (
        "queued", "c7", None, 10, at, 0)
    assert rows[f"{bid}:8"].owner == "o" and rows[f"{bid}:8"].prompt is None
    if store.dialect == "postgresql":
        with pytest.raises(StoreError):
            store.insert_requests([{"id": f"{bid}:long", "custom_id": "x" * 600}])
        assert store.get_request(f"{bid}:long") is None


def test_list_newest_first_with_cursor_and_owner(store: Store):
    ids = [new(store, f"batch_l{i}", owner="o1" if i % 2 else "o2") for i in range(5)]
    got = [b.id for b in store.list_batches(limit=100)]
    assert got == ids[::-1]
    page = store.list_batches(limit=2)
    assert [b.id for b in page] == ids[:2:-1][:2]
    rest = store.list_batches(after=page[-1].id, limit=100)
    assert [b.id for b in page + rest] == ids[::-1]
    assert [b.id for b in store.list_batches(owner="o1")] == ["batch_l3", "batch_l1"]
    store.transition_batch("batch_l0", "in_progress")
    assert store.batch_ids(["in_progress"]) == ["batch_l0"]
    assert len(store.batch_ids(["validating"])) == 4
