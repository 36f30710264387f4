"""The cancel topic, read by every worker outside the consumer group.

Each worker assigns itself every partition of `inflight.cancel` and starts at the first
message stamped at or after `now - INFLIGHT_CANCEL_LOOKBACK_S` (`offsets_for_times`, which
is correct on Tansu and Kafka; "latest" is not used, and neither are end offsets, which
Tansu gets wrong). So a cancel sent while no worker ran still reaches a request that is
still queued when a worker starts, within the lookback.

NOTE: the cancels of the lookback window are read before the worker admits anything: the
constructor reads until a poll comes back empty (at most CATCH_UP_S) and the first poll()
returns them. After that a thread of its own reads the topic (a blocking poll, so a cancel
is taken in as soon as its fetch returns) and hands what it reads to poll(), which the
intake calls every round and which never waits: the start-offset lookups and the fetches
run on that thread, never on the intake's (which, loaded, had let a batch's queued
requests be admitted for seconds after its cancel: docs/benchmarks.md, batch cancel). Until some message is stamped inside the window, the lookup is retried now
and then. Values (schemas.cancel): `{"request_id": ...}` (or a raw id) for one request,
`{"batch_id": ...}` for every request of a batch. Memory stays bounded: the worker
remembers cancelled request ids in an LRU set (the newest ones win) and cancelled batches
for the lookback window (CancelledBatches).
"""

from __future__ import annotations

import logging
import queue
import threading
import time

from collections import OrderedDict

from kafka import TopicPartition
from kafka.errors import KafkaError

from inflight.schemas.cancel import Cancel, parse_cancel
from inflight.transport.kafka_clients import partitions_of, plain_consumer
from inflight.schemas.settings import Settings

log = logging.getLogger("inflight.cancel")

MAX_BATCHES = 100_000  # cancelled batches remembered at once (the oldest go first)


class CancelledBatches:
    """Batch ids cancelled within the lookback window, each with when it was cancelled
    (the record's time stamp): kept until the window has passed over it."""

    def __init__(self, lookback_s: float, maxlen: int = MAX_BATCHES):
        self.lookback_s = lookback_s
        self.maxlen = maxlen
        self._at: OrderedDict[str, float] = OrderedDict()   # oldest first

    def add(self, batch_id: str, at: float) -> None:
        self._at.pop(batch_id, None)
        self._at[batch_id] = at
        self.prune()
        while len(self._at) > self.maxlen:
            self._at.popitem(last=False)

    def prune(self, now: float | None = None) -> None:
        horizon = (time.time() if now is None else now) - self.lookback_s
        while self._at and next(iter(self._at.values())) < horizon:
            self._at.popitem(last=False)

    def __contains__(self, batch_id: object) -> bool:
        return batch_id in self._at

    def __len__(self) -> int:
        return len(self._at)


class CancelListener:
    RESOLVE_EVERY_S = 0.2
    CATCH_UP_S = 5.0         # at most this long reading the window's backlog at start
    CATCH_UP_POLL_MS = 300   # a poll this long that returns nothing = caught up
    # NOTE: how long the broker may hold a fetch that finds nothing (at most
    # INFLIGHT_KAFKA_PYTHON_FETCH_MAX_WAIT_MS). poll() never waits, so a cancel that lands while a
    # fetch is held is read only when that fetch returns: at kafka-python's default (500)
    # a cancel reached the worker too late to stop a tiny model before it finished
    # (docs/benchmarks.md, delivery path).
    FETCH_MAX_WAIT_MS = 50
    # a start-offset lookup that takes longer is tried again (on the reader's own thread)
    LOOKUP_TIMEOUT_MS = 2000
    READ_WAIT_MS = 200       # the reader thread's poll: returns as soon as records come

    def __init__(self, settings: Settings, since: float | None = None, *,
                 follow_live: bool = True):
        """Read cancels stamped at or after `since` (epoch seconds; default: now minus
        settings.cancel_lookback_s). `follow_live`: when the window's backlog is more than
        the start-up read takes in, a second reader follows the cancels stamped from now on
        (see _catch_up), so a new cancel never waits behind the backlog."""
        started = time.time()
        if since is None:
            since = time.time() - settings.cancel_lookback_s
        self.since_ms = int(since * 1000)
        self.consumer = plain_consumer(settings, fetch_max_wait_ms=min(
            self.FETCH_MAX_WAIT_MS, settings.kafka_python_fetch_max_wait_ms))
        parts = partitions_of(self.consumer, settings.topic_cancel)
        self.tps = [TopicPartition(settings.topic_cancel, p) for p in parts]
        self.consumer.assign(self.tps)
        self.consumer.pause(*self.tps)  # nothing is read until a start offset is known
        self._unresolved = set(self.tps)
        self._next_resolve = 0.0
        self._behind = False
        self._backlog = self._catch_up()
        if self._backlog:
            log.info("cancel topic: %d cancels from the last %.0fs", len(self._backlog),
                     time.time() - since)
        # NOTE: the rest of a large backlog is read by this reader's thread, in the
        # partitions' order; a cancel sent now would wait behind it (a 200,000-cancel window:
        # 9 s, benchmarks/cancel_backlog.py). The live reader starts at the records stamped
        # from `started` on; the two overlap at most there, and a cancel read twice is
        # applied twice to the same effect.
        self._live = (CancelListener(settings, since=started, follow_live=False)
                      if follow_live and self._behind else None)
        if self._live is not None:
            log.info("cancel topic: the window's backlog is read on; new cancels are followed "
                     "apart meanwhile")
        self._read_out: queue.SimpleQueue[tuple[Cancel, float]] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cancel-reader", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        """The reader thread: the only user of the consumer once the constructor returned."""
        while not self._stop.is_set():
            try:
                self._resolve()
                if len(self._unresolved) == len(self.tps):
                    self._stop.wait(0.05)  # nothing stamped inside the window yet
                    continue
                got: list[tuple[Cancel, float]] = []
                self._read(self.READ_WAIT_MS, got)
                for item in got:
                    self._read_out.put(item)
            except Exception:  # noqa: BLE001 - the reader goes on; the next poll retries
                if self._stop.is_set():
                    return
                log.exception("cancel topic: reading failed; retrying")
                self._stop.wait(0.5)

    def _catch_up(self) -> list[tuple[Cancel, float]]:
        self._resolve()
        ids: list[tuple[Cancel, float]] = []
        if len(self._unresolved) == len(self.tps):
            return ids  # nothing stamped inside the window yet
        deadline = time.monotonic() + self.CATCH_UP_S
        while self._read(self.CATCH_UP_POLL_MS, ids):
            if time.monotonic() >= deadline:
                self._behind = True  # records still coming: the thread reads the rest
                break
        return ids

    def _resolve(self) -> None:
        now = time.monotonic()
        if not self._unresolved or now < self._next_resolve:
            return
        self._next_resolve = now + self.RESOLVE_EVERY_S
        try:
            found = self.consumer.offsets_for_times({tp: self.since_ms for tp in self._unresolved},
                                                    timeout_ms=self.LOOKUP_TIMEOUT_MS)
        except KafkaError as exc:
            log.warning("cancel topic: offsets_for_times failed (%s); retrying", exc)
            return
        for tp, ot in found.items():
            if ot is not None:
                self.consumer.seek(tp, ot.offset)
                self.consumer.resume(tp)
                self._unresolved.discard(tp)

    def poll(self) -> list[tuple[Cancel, float]]:
        """(cancel, when it was sent: epoch seconds) of each cancel read since the last call
        (the first call: also those of the lookback window read at start). Never blocks."""
        ids, self._backlog = self._backlog, []
        if self._live is not None:
            ids += self._live.poll()
        while True:
            try:
                ids.append(self._read_out.get_nowait())
            except queue.Empty:
                return ids

    def _read(self, timeout_ms: int, out: list[tuple[Cancel, float]]) -> int:
        """Append the cancels of one poll to `out`; returns the number of records."""
        n = 0
        now = time.time()
        for records in self.consumer.poll(timeout_ms=timeout_ms).values():
            n += len(records)
            for rec in records:
                if rec.timestamp is not None and rec.timestamp < self.since_ms:
                    continue
                cancel = parse_cancel(rec.value, rec.key)
                if cancel is not None:
                    out.append((cancel, rec.timestamp / 1000.0 if rec.timestamp else now))
        return n

    def close(self) -> None:
        if self._live is not None:
            self._live.close()
        self._stop.set()
        self._thread.join(timeout=self.READ_WAIT_MS / 1000 + self.LOOKUP_TIMEOUT_MS / 1000 + 5)
        self.consumer.close()
