"""kafka-python clients built from Settings: the one place every process of the project
(worker, recorder, cancel reader, producer client, topics admin) gets its connections.

The settings our producers and group consumers share with the librdkafka ones
(transport.librdkafka_producer, consumers.recorder_source) are written once, in Kafka's own
dotted names (librdkafka's), and turned into kafka-python's keywords by `kafka_python_names`.
"""

from __future__ import annotations

import time
from typing import Any

from kafka import KafkaConsumer, KafkaProducer
from kafka.errors import KafkaError

from inflight.schemas.errors import BrokerError
from inflight.schemas.settings import Settings
from inflight.transport import kafka_parked, kafka_records


# Kafka's name -> kafka-python's, where it is not just the dots made underscores
_KAFKA_PYTHON_NAMES = {"message.max.bytes": "max_request_size",
                       "fetch.wait.max.ms": "fetch_max_wait_ms"}


def kafka_python_names(config: dict[str, Any]) -> dict[str, Any]:
    """Settings in Kafka's dotted names as kafka-python keyword arguments."""
    return {_KAFKA_PYTHON_NAMES.get(k, k.replace(".", "_")): v for k, v in config.items()}


def producer_config(settings: Settings) -> dict[str, Any]:
    """Every producer of ours, in Kafka's names: acks=all; idempotence only when
    INFLIGHT_KAFKA_ENABLE_IDEMPOTENCE (Tansu loses producer ids across restarts, which
    wedges an idempotent producer); room for a message at the limit plus its overhead."""
    return {"acks": "all", "linger.ms": settings.kafka_linger_ms,
            "enable.idempotence": settings.kafka_enable_idempotence,
            "message.max.bytes": settings.kafka_max_message_bytes + 64_000}


def group_config(settings: Settings, group: str) -> dict[str, Any]:
    """Every group consumer of ours, in Kafka's names: manual commits, reading from the
    earliest offset when the group has none (a fresh group must not skip requests already
    queued), fetches that hold a message at the limit. fetch.wait.max.ms is the librdkafka
    consumers' (consumers.kafka_io.group_consumer sets kafka-python's own)."""
    return {"group.id": group, "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "session.timeout.ms": settings.kafka_session_timeout_ms,
            "heartbeat.interval.ms": settings.kafka_heartbeat_interval_ms,
            "max.poll.interval.ms": settings.kafka_max_poll_interval_ms,
            "fetch.wait.max.ms": settings.kafka_fetch_max_wait_ms,
            "fetch.max.bytes": max(settings.kafka_max_message_bytes * 4, 4_000_000),
            "max.partition.fetch.bytes": settings.kafka_max_message_bytes + 64_000}


def connect(client_cls: type, settings: Settings, **opts: Any) -> Any:
    """A kafka-python client (producer, consumer, admin) built from Settings; an unreachable
    broker becomes BrokerError that says what to do. Installs the tolerant record parse
    first (transport.kafka_records), so no fetched record can stop a consumer of ours, and
    the fetcher fix that keeps a resumed partition read (transport.kafka_parked)."""
    kafka_records.install()
    kafka_parked.install()
    try:
        return client_cls(**settings.kafka_common(), **opts)
    except KafkaError as exc:
        raise BrokerError(f"cannot reach Kafka at {settings.kafka_bootstrap!r} ({exc}): start "
                          "a broker (`inflight broker`) or set INFLIGHT_KAFKA_BOOTSTRAP") from exc


def producer(settings: Settings, **overrides: Any) -> KafkaProducer:
    """A kafka-python producer with `producer_config`; `overrides` in kafka-python's names."""
    opts = kafka_python_names(producer_config(settings))
    opts.update(overrides)
    return connect(KafkaProducer, settings, **opts)


def plain_consumer(settings: Settings, **overrides: Any) -> KafkaConsumer:
    """A consumer outside any group (manual assign)."""
    opts: dict[str, Any] = {"group_id": None, "enable_auto_commit": False,
                            "auto_offset_reset": "earliest",
                            "fetch_max_wait_ms": settings.kafka_python_fetch_max_wait_ms}
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
