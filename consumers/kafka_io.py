"""kafka-python clients built from Settings, the way every consumer process wants them."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

from kafka import KafkaConsumer, KafkaProducer
from kafka.errors import KafkaError

from schemas.errors import BrokerError
from schemas.settings import Settings


def connect(client_cls: type, settings: Settings, **opts: Any) -> Any:
    """A kafka-python client (producer, consumer, admin) built from Settings; an unreachable
    broker becomes BrokerError that says what to do."""
    try:
        return client_cls(**settings.kafka_common(), **opts)
    except KafkaError as exc:
        raise BrokerError(f"cannot reach Kafka at {settings.kafka_bootstrap!r} ({exc}): start "
                          "a broker (`inflight broker`) or set INFLIGHT_KAFKA_BOOTSTRAP") from exc


def producer(settings: Settings, **overrides: Any) -> KafkaProducer:
    """acks=all; idempotence only when INFLIGHT_KAFKA_ENABLE_IDEMPOTENCE (Tansu loses
    producer ids across restarts, which wedges an idempotent producer)."""
    opts: dict[str, Any] = {"acks": "all", "linger_ms": 2,
                            "enable_idempotence": settings.kafka_enable_idempotence,
                            "max_request_size": settings.kafka_max_message_bytes + 64_000}
    opts.update(overrides)
    return connect(KafkaProducer, settings, **opts)


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


def plain_consumer(settings: Settings, **overrides: Any) -> KafkaConsumer:
    """A consumer outside any group (manual assign)."""
    opts: dict[str, Any] = {"group_id": None, "enable_auto_commit": False,
                            "auto_offset_reset": "earliest"}
    opts.update(overrides)
    return connect(KafkaConsumer, settings, **opts)


def partitions_of(consumer: KafkaConsumer, topic: str, timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while True:
        parts = consumer.partitions_for_topic(topic)
        if parts:
            return sorted(parts)
        if time.monotonic() > deadline:
            raise BrokerError(f"topic {topic!r} does not exist: run `inflight topics create`")
        consumer.topics()  # refresh metadata
        time.sleep(0.1)


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
