"""The cancel topic, read by every worker outside the consumer group.

Each worker assigns itself every partition of `inflight.cancel` and starts at the first
message stamped at or after `now - INFLIGHT_CANCEL_LOOKBACK_S` (`offsets_for_times`, which
is correct on Tansu and Kafka; "latest" is not used, and neither are end offsets, which
Tansu gets wrong). So a cancel sent while no worker ran still reaches a request that is
still queued when a worker starts, within the lookback.

NOTE: the cancels of the lookback window are read before the worker admits anything: the
constructor reads until a poll comes back empty (at most CATCH_UP_S) and the first poll()
returns them. Until some message is stamped inside the window, the lookup is retried now
and then. Values are a request id, raw or as `{"request_id": ...}`. Memory stays bounded:
the worker remembers cancelled ids in an LRU set (the newest ones win).
"""

from __future__ import annotations

import logging
import time

import orjson
from kafka import TopicPartition
from kafka.errors import KafkaError

from inflight.schemas.base import ID_RE
from inflight.schemas.kafka_clients import partitions_of, plain_consumer
from inflight.schemas.settings import Settings

log = logging.getLogger("inflight.cancel")


def parse_cancel(value: bytes | None, key: bytes | None) -> str | None:
    for raw in (value, key):
        if not raw:
            continue
        try:
            obj = orjson.loads(raw)
            rid = obj.get("request_id") if isinstance(obj, dict) else obj
        except orjson.JSONDecodeError:
            rid = raw.decode("utf-8", "replace").strip()
        if isinstance(rid, str) and ID_RE.match(rid):
            return rid
    return None


class CancelListener:
    RESOLVE_EVERY_S = 0.5
    CATCH_UP_S = 5.0         # at most this long reading the window's backlog at start
    CATCH_UP_POLL_MS = 300   # a poll this long that returns nothing = caught up
    # NOTE: how long the broker may hold a fetch that finds nothing. poll() never waits, so
    # a cancel that lands while a fetch is held is read only when that fetch returns: at
    # kafka-python's default a cancel reached the worker too late to stop a tiny model
    # before it finished (docs/benchmarks.md, delivery path).
    FETCH_MAX_WAIT_MS = 50

    def __init__(self, settings: Settings, since: float | None = None):
        """Read cancels stamped at or after `since` (epoch seconds; default: now minus
        settings.cancel_lookback_s)."""
        if since is None:
            since = time.time() - settings.cancel_lookback_s
        self.since_ms = int(since * 1000)
        self.consumer = plain_consumer(settings, fetch_max_wait_ms=self.FETCH_MAX_WAIT_MS)
        parts = partitions_of(self.consumer, settings.topic_cancel)
        self.tps = [TopicPartition(settings.topic_cancel, p) for p in parts]
        self.consumer.assign(self.tps)
        self.consumer.pause(*self.tps)  # nothing is read until a start offset is known
        self._unresolved = set(self.tps)
        self._next_resolve = 0.0
        self._backlog = self._catch_up()
        if self._backlog:
            log.info("cancel topic: %d cancels from the last %.0fs", len(self._backlog),
                     time.time() - since)

    def _catch_up(self) -> list[str]:
        self._resolve()
        ids: list[str] = []
        if len(self._unresolved) == len(self.tps):
            return ids  # nothing stamped inside the window yet
        deadline = time.monotonic() + self.CATCH_UP_S
        while time.monotonic() < deadline and self._read(self.CATCH_UP_POLL_MS, ids):
            pass
        return ids

    def _resolve(self) -> None:
        now = time.monotonic()
        if not self._unresolved or now < self._next_resolve:
            return
        self._next_resolve = now + self.RESOLVE_EVERY_S
        try:
            found = self.consumer.offsets_for_times({tp: self.since_ms for tp in self._unresolved})
        except KafkaError as exc:
            log.warning("cancel topic: offsets_for_times failed (%s); retrying", exc)
            return
        for tp, ot in found.items():
            if ot is not None:
                self.consumer.seek(tp, ot.offset)
                self.consumer.resume(tp)
                self._unresolved.discard(tp)

    def poll(self) -> list[str]:
        """Request ids cancelled since the last call (the first call: also those of the
        lookback window read at start). Never blocks."""
        ids, self._backlog = self._backlog, []
        self._resolve()
        if len(self._unresolved) < len(self.tps):
            self._read(0, ids)
        return ids

    def _read(self, timeout_ms: int, ids: list[str]) -> int:
        """Append the request ids of one poll to `ids`; returns the number of records."""
        n = 0
        for records in self.consumer.poll(timeout_ms=timeout_ms).values():
            n += len(records)
            for rec in records:
                if rec.timestamp is not None and rec.timestamp < self.since_ms:
                    continue
                rid = parse_cancel(rec.value, rec.key)
                if rid is not None:
                    ids.append(rid)
        return n

    def close(self) -> None:
        self.consumer.close()
