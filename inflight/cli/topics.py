"""Create the topics of DESIGN.md explicitly (never rely on auto-creation)."""

from __future__ import annotations

from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

from inflight.schemas.errors import BrokerError
from inflight.transport.kafka_clients import connect
from inflight.schemas.settings import Settings


def admin_client(settings: Settings) -> KafkaAdminClient:
    return connect(KafkaAdminClient, settings, client_id="inflight-admin")


def create_topics(settings: Settings, partitions: int = 4, replication: int = 1,
                  batch_partitions: int | None = None) -> dict[str, str]:
    """Create every topic that does not exist yet. Returns {topic: "created" | "exists"}.

    The cancel topic has one partition: every worker reads all of it.
    """
    plan = {
        settings.topic_requests: partitions,
        settings.topic_requests_batch: batch_partitions or partitions,
        settings.topic_results: partitions,
        settings.topic_results_tokens: partitions,
        settings.topic_dlq: 1,
        settings.topic_cancel: 1,
    }
    admin = admin_client(settings)
    try:
        existing = set(admin.list_topics())
        status = {t: "exists" for t in plan if t in existing}
        todo = [NewTopic(t, n, replication) for t, n in plan.items() if t not in existing]
        for topic in todo:
            try:
                admin.create_topics([topic])
                status[topic.name] = "created"
            except TopicAlreadyExistsError:
                status[topic.name] = "exists"
            except KafkaError as exc:
                raise BrokerError(f"could not create topic {topic.name!r}: {exc}") from exc
        return status
    finally:
        admin.close()
