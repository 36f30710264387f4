"""kafka-python clients built from Settings: the one place every process of the project
(worker, recorder, cancel reader, producer client, topics admin) gets its connections.

It lives in `schemas/` because both `consumers/` and `producers/` may import it (DESIGN.md's
import table); it knows Settings and the error tree, nothing else of the project.
"""

from __future__ import annotations

import time
from typing import Any

from kafka import KafkaConsumer, KafkaProducer
from kafka.errors import KafkaError

from inflight.schemas import kafka_records
from inflight.schemas.errors import BrokerError
from inflight.schemas.settings import Settings


def connect(client_cls: type, settings: Settings, **opts: Any) -> Any:
    """A kafka-python client (producer, consumer, admin) built from Settings; an unreachable
    broker becomes BrokerError that says what to do. Installs the tolerant record parse
    first (schemas.kafka_records), so no fetched record can stop a consumer of ours."""
    kafka_records.install()
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


def plain_consumer(settings: Settings, **overrides: Any) -> KafkaConsumer:
    """A consumer outside any group (manual assign)."""
    opts: dict[str, Any] = {"group_id": None, "enable_auto_commit": False,
                            "auto_offset_reset": "earliest"}
    opts.update(overrides)
    return connect(KafkaConsumer, settings, **opts)


def partitions_of(consumer: KafkaConsumer, topic: str, timeout: float = 10.0) -> list[int]:
    """The topic's partition numbers (metadata refreshed until they show up); BrokerError
    when the topic does not exist after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        parts = consumer.partitions_for_topic(topic)
        if parts:
            return sorted(parts)
        if time.monotonic() > deadline:
            raise BrokerError(f"topic {topic!r} does not exist: run `inflight topics create`")
        consumer.topics()  # refresh metadata
        time.sleep(0.1)
