"""Create the topics of DESIGN.md explicitly (never rely on auto-creation): the shared ones,
and the request topics of each model named (transport/model_topics.py).

Used by `inflight topics create [--model NAME]`, `inflight broker`, and a worker at start
(INFLIGHT_WORKER_CREATE_TOPICS: its own model's topics, if the broker lets it).
"""

from __future__ import annotations

from collections.abc import Iterable

from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

from inflight.schemas.errors import BrokerError
from inflight.schemas.settings import Settings
from inflight.transport.kafka_clients import connect
from inflight.transport.model_topics import ModelTopics

# the registry keeps the last record per key (schemas/registry.py): a compacted log
REGISTRY_CONFIGS = {"cleanup.policy": "compact"}


def admin_client(settings: Settings) -> KafkaAdminClient:
    return connect(KafkaAdminClient, settings, client_id="inflight-admin")


def topic_plan(settings: Settings, partitions: int, batch_partitions: int | None = None,
               models: Iterable[ModelTopics] = ()) -> dict[str, int]:
    """{topic: partitions} of the shared topics and of each model's request topics. The
    cancel topic has one partition (every worker reads all of it), the registry one (a
    reader follows one log)."""
    plan = {
        settings.topic_requests: partitions,
        settings.topic_requests_batch: batch_partitions or partitions,
        settings.topic_results: partitions,
        settings.topic_results_tokens: partitions,
        settings.topic_dlq: 1,
        settings.topic_cancel: 1,
        settings.topic_models: 1,
        settings.topic_batch_events: partitions,   # keyed by batch id (docs/batch-jobs.md)
    }
    for m in models:
        plan.setdefault(m.requests, partitions)
        plan.setdefault(m.batch, batch_partitions or partitions)
    return plan


def create_topics(settings: Settings, partitions: int = 4, replication: int = 1,
                  batch_partitions: int | None = None,
                  models: Iterable[ModelTopics] = ()) -> dict[str, str]:
    """Create every topic of `topic_plan` that does not exist yet. Returns {topic: "created"
    | "exists"}; BrokerError when the broker refuses one (e.g. not authorized)."""
    plan = topic_plan(settings, partitions, batch_partitions, models)
    admin = admin_client(settings)
    try:
        existing = set(admin.list_topics())
        status = {t: "exists" for t in plan if t in existing}
        todo = [NewTopic(t, n, replication,
                         topic_configs=REGISTRY_CONFIGS if t == settings.topic_models else {})
                for t, n in plan.items() if t not in existing]
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
