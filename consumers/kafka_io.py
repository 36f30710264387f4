"""What only the consumers need of Kafka: the group consumer, and a bounded id set.
(Producers, plain consumers and partition lookups: schemas.kafka_clients.)"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

from kafka import KafkaConsumer

from inflight.schemas.kafka_clients import connect
from inflight.schemas.settings import Settings


def group_consumer(settings: Settings, group: str, **overrides: Any) -> KafkaConsumer:
    """A consumer in `group` with manual commits, reading from the earliest offset when the
    group has none (a fresh group must not skip requests already queued)."""
    opts: dict[str, Any] = {
        "group_id": group, "enable_auto_commit": False, "auto_offset_reset": "earliest",
        "session_timeout_ms": settings.kafka_session_timeout_ms,
        "heartbeat_interval_ms": settings.kafka_heartbeat_interval_ms,
        "fetch_max_bytes": max(settings.kafka_max_message_bytes * 4, 4_000_000),
        "max_partition_fetch_bytes": settings.kafka_max_message_bytes + 64_000,
    }
    opts.update(overrides)
    return connect(KafkaConsumer, settings, **opts)


class LRUSet:
    """A bounded set that forgets the oldest entries first."""

    def __init__(self, maxlen: int):
        self.maxlen = maxlen
        self._d: OrderedDict[Hashable, None] = OrderedDict()

    def add(self, key: Hashable) -> None:
        self._d[key] = None
        self._d.move_to_end(key)
        while len(self._d) > self.maxlen:
            self._d.popitem(last=False)

    def discard(self, key: Hashable) -> None:
        self._d.pop(key, None)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._d

    def __len__(self) -> int:
        return len(self._d)
