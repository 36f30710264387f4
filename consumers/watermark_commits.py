"""The intake's offset commits: each owned partition's watermark (consumers.offsets), sent
on the intake's thread, which owns the group consumer.

    commit(consumer, wait=False)   the loop, every COMMIT_EVERY_S: asynchronous, one commit
                                   in flight at a time (the loop never waits on the broker);
                                   its outcome comes back inside a later poll()
    commit(consumer, wait=True)    shutdown, tests: synchronous, at most COMMIT_WAIT_MS
    apply_outcomes()               every round: what the asynchronous commits answered

A failed commit is logged and the watermark committed again later; nothing is lost (the
offsets not committed are redelivered, their requests' finals already acknowledged).
"""

from __future__ import annotations

import logging
import queue
import time
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import CommitFailedError, KafkaError
from kafka.future import Future
from kafka.structs import OffsetAndMetadata

from inflight.consumers.metrics import Metrics
from inflight.consumers.offsets import OffsetTracker

log = logging.getLogger("inflight.worker")

COMMIT_EVERY_S = 0.25
COMMIT_WAIT_MS = 5_000   # commit(wait=True) (shutdown, tests): at most this long

# (the offsets sent, the commit's answer: the committed offsets or the exception)
Outcome = tuple[dict[TopicPartition, int], Any]


class WatermarkCommits:
    def __init__(self, tracker: OffsetTracker, metrics: Metrics):
        self.tracker = tracker
        self.metrics = metrics
        self.last_commit = 0.0
        self._outcomes: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
        self._in_flight = False
        self._future: Future | None = None   # the commit in flight

    @property
    def due(self) -> bool:
        return time.monotonic() - self.last_commit >= COMMIT_EVERY_S

    def commit(self, consumer: KafkaConsumer, wait: bool) -> None:
        """Commit each assigned partition's watermark (a no-op when it has not moved).
        `wait`: synchronously, for at most COMMIT_WAIT_MS (shutdown, tests); else
        asynchronously, one commit in flight at a time (the loop)."""
        self.last_commit = time.monotonic()
        if self._in_flight:
            if not wait:
                return
            self._await()
        assigned = consumer.assignment()
        offsets = {tp: off for tp, off in self.tracker.to_commit().items() if tp in assigned}
        if not offsets:
            return
        commit = {tp: OffsetAndMetadata(off, "", -1) for tp, off in offsets.items()}
        if wait:
            try:
                consumer.commit(commit, timeout_ms=COMMIT_WAIT_MS)
            except (CommitFailedError, KafkaError) as exc:
                log.warning("commit failed (%s); the watermark is committed again later", exc)
                return
            self._committed(offsets)
            return
        self._in_flight = True
        done = self._outcomes.put
        try:
            # NOTE: the callback runs on this thread, inside a later poll(); it only enqueues
            self._future = consumer.commit_async(
                commit, callback=lambda _o, res: done((offsets, res)))
        except (CommitFailedError, KafkaError) as exc:
            done((offsets, exc))

    def apply_outcomes(self) -> None:
        while True:
            try:
                offsets, res = self._outcomes.get_nowait()
            except queue.Empty:
                return
            self._in_flight = False
            if isinstance(res, BaseException):
                log.warning("commit failed (%s); the watermark is committed again later", res)
            else:
                self._committed(offsets)

    def _await(self) -> None:
        """Let the commit in flight reach the broker before a synchronous one (so they land
        in order); its outcome is applied at a later poll (marking older offsets committed
        at worst costs one more commit)."""
        deadline = time.monotonic() + COMMIT_WAIT_MS / 1000
        fut = self._future
        while fut is not None and not fut.is_done and time.monotonic() < deadline:
            time.sleep(0.01)
        self._in_flight = False

    def _committed(self, offsets: dict[TopicPartition, int]) -> None:
        self.tracker.mark_committed(offsets)
        self.metrics.inc("commits")
