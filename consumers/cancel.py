"""The cancel topic, read by every worker outside the consumer group.

Each worker assigns itself every partition of `inflight.cancel` and starts at the first
message stamped at or after its own start time (`offsets_for_times`, which is correct on
Tansu and Kafka; "latest" is not used). Until such a message exists, the lookup is retried
now and then. Values are a request id, raw or as `{"request_id": ...}`.
"""

from __future__ import annotations

import logging
import time

import orjson
from kafka import TopicPartition
from kafka.errors import KafkaError

from schemas.base import ID_RE
from schemas.kafka_clients import partitions_of, plain_consumer
from schemas.settings import Settings

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

    def __init__(self, settings: Settings, since: float | None = None):
        self.since_ms = int((since if since is not None else time.time()) * 1000)
        self.consumer = plain_consumer(settings)
        parts = partitions_of(self.consumer, settings.topic_cancel)
        self.tps = [TopicPartition(settings.topic_cancel, p) for p in parts]
        self.consumer.assign(self.tps)
        self.consumer.pause(*self.tps)  # nothing is read until a start offset is known
        self._unresolved = set(self.tps)
        self._next_resolve = 0.0

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
        """Request ids cancelled since the last call (never blocks)."""
        self._resolve()
        if len(self._unresolved) == len(self.tps):
            return []
        ids = []
        for records in self.consumer.poll(timeout_ms=0).values():
            for rec in records:
                if rec.timestamp is not None and rec.timestamp < self.since_ms:
                    continue
                rid = parse_cancel(rec.value, rec.key)
                if rid is not None:
                    ids.append(rid)
        return ids

    def close(self) -> None:
        self.consumer.close()
