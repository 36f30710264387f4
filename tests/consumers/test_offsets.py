"""Watermark arithmetic of consumers.offsets (no broker)."""

from __future__ import annotations

import random

from inflight.consumers.offsets import OffsetTracker, PartitionWatermark


def test_watermark_waits_for_the_lowest_pending_offset():
    w = PartitionWatermark()
    for off in range(10, 15):
        w.add(off)
    assert w.committable() == 10
    w.done(12)
    w.done(13)
    w.done(10)
    assert w.committable() == 11          # 11 still pending: 12 and 13 are redone on a crash
    w.done(14)
    assert w.committable() == 11
    w.done(11)
    assert w.committable() == 15          # everything settled: one past the highest seen


def test_tracker_reports_only_moved_partitions_and_lag():
    t = OffsetTracker()
    t.add("a", 0)
    t.add("a", 1)
    t.add("b", 5)
    assert t.to_commit() == {"a": 0, "b": 5}
    t.mark_committed({"a": 0, "b": 5})
    assert t.to_commit() == {}
    assert t.lag == 2 + 1
    t.done("a", 1)
    assert t.to_commit() == {}            # 0 still pending
    t.done("a", 0)
    assert t.to_commit() == {"a": 2}
    t.forget(["b"])
    assert "b" not in t.parts and t.num_pending == 0


def test_random_completion_order_never_commits_past_a_pending_offset():
    rng = random.Random(7)
    w = PartitionWatermark()
    offsets = list(range(200))
    for off in offsets:
        w.add(off)
    order = offsets[:]
    rng.shuffle(order)
    finished = set()
    for off in order:
        w.done(off)
        finished.add(off)
        c = w.committable()
        assert all(o in finished for o in range(c))          # everything below is done
        assert c == 200 or c not in finished                  # and c itself is not
