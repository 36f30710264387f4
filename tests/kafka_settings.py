"""Settings for tests that share one broker: topics and groups of their own, created."""

from __future__ import annotations

import uuid

from inflight.schemas import Settings


def make_settings(broker, database_url: str, partitions: int = 2, **overrides) -> Settings:
    """Settings pointed at `broker` with unique topic and group names (tests sharing the
    broker never see each other's messages); the topics are created up front."""
    from inflight.cli.topics import create_topics

    tag = uuid.uuid4().hex[:8]
    overrides = {"kafka_session_timeout_ms": 2000,  # Tansu: a group join takes about half
                 "kafka_heartbeat_interval_ms": 500,
                 # INFLIGHT_WORKER_MAX_INFLIGHT is the whole bound in tests (backpressure,
                 # in-flight peaks); tests of fair share set a read-ahead of their own
                 "worker_read_ahead": 0, **overrides}
    s = Settings(
        kafka_bootstrap=broker.bootstrap,
        topic_requests=f"t{tag}.requests",
        topic_requests_batch=f"t{tag}.requests.batch",
        topic_results=f"t{tag}.results",
        topic_results_tokens=f"t{tag}.results.tokens",
        topic_dlq=f"t{tag}.requests.dlq",
        topic_cancel=f"t{tag}.cancel",
        topic_models=f"t{tag}.models",
        topic_batch_events=f"t{tag}.batch-events",
        worker_group=f"t{tag}-workers",
        recorder_group=f"t{tag}-recorder",
        database_url=database_url,
        **overrides,
    )
    create_topics(s, partitions=partitions)
    return s
