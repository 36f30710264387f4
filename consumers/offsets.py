"""Per-partition commit watermarks for out-of-order completion.

Requests polled from one partition finish in any order. A partition's committable offset
is the lowest offset still pending (its final event not yet acknowledged by Kafka), or
one past the highest offset seen when nothing is pending:

    offsets polled:     10  11  12  13  14
    final acked:         x       x   x
    pending:                 11          14
    committable:            11                 (12 and 13 are redone after a crash;
                                                their results are idempotent)

NOTE: commit lag is measured as (highest polled + 1) - committed, from what this worker
saw; never from the broker's end offsets (wrong on Tansu).
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable


class PartitionWatermark:
    """Offsets of one partition: pending set + a min-heap with lazy deletion."""

    __slots__ = ("_pending", "_heap", "next_offset", "committed")

    def __init__(self) -> None:
        self._pending: set[int] = set()
        self._heap: list[int] = []
        self.next_offset: int | None = None  # highest offset seen + 1
        self.committed: int | None = None     # last offset committed

    def add(self, offset: int) -> None:
        if offset in self._pending:
            return
        self._pending.add(offset)
        heapq.heappush(self._heap, offset)
        if self.next_offset is None or offset >= self.next_offset:
            self.next_offset = offset + 1

    def done(self, offset: int) -> None:
        self._pending.discard(offset)

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    def committable(self) -> int | None:
        """The offset to commit (the next one to read after a restart), or None."""
        while self._heap and self._heap[0] not in self._pending:
            heapq.heappop(self._heap)
        if self._heap:
            return self._heap[0]
        return self.next_offset

    @property
    def lag(self) -> int:
        if self.next_offset is None:
            return 0
        return self.next_offset - (self.committed if self.committed is not None else 0)


class OffsetTracker:
    """Watermarks for every partition a consumer owns. Keys are TopicPartitions."""

    def __init__(self) -> None:
        self.parts: dict[Hashable, PartitionWatermark] = {}

    def add(self, tp: Hashable, offset: int) -> None:
        self.parts.setdefault(tp, PartitionWatermark()).add(offset)

    def done(self, tp: Hashable, offset: int) -> None:
        part = self.parts.get(tp)
        if part is not None:
            part.done(offset)

    def to_commit(self) -> dict[Hashable, int]:
        """{tp: offset} for partitions whose watermark moved past the last commit."""
        out = {}
        for tp, part in self.parts.items():
            off = part.committable()
            if off is not None and off != part.committed:
                out[tp] = off
        return out

    def mark_committed(self, offsets: dict[Hashable, int]) -> None:
        for tp, off in offsets.items():
            part = self.parts.get(tp)
            if part is not None:
                part.committed = off

    def forget(self, tps: Iterable[Hashable]) -> None:
        """Partitions revoked in a rebalance: their offsets are no longer ours to commit."""
        for tp in tps:
            self.parts.pop(tp, None)

    @property
    def num_pending(self) -> int:
        return sum(p.num_pending for p in self.parts.values())

    @property
    def lag(self) -> int:
        return sum(p.lag for p in self.parts.values())
