"""Kafka consumer lag per partition, for the metrics endpoint only.

lag = end offset (log end) - committed offset of the group, per topic partition, read by
a client of its own in a daemon thread every `interval_s` (the service's own consumer is
not thread-safe and never waits on this).

NOTE: end offsets are for this metric and nothing else. The embedded broker (Tansu)
reports them wrongly (docs/deployment.md), so on it the figure is only indicative; no
logic of the service may depend on end offsets or "latest".
"""

from __future__ import annotations

import logging
import threading


from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from prometheus_client import CollectorRegistry, Gauge

from inflight.transport.kafka_clients import connect
from inflight.schemas.settings import Settings

log = logging.getLogger("inflight.lag")


class LagProbe:
    def __init__(self, settings: Settings, group: str, topics: list[str],
                 registry: CollectorRegistry, interval_s: float = 5.0):
        self.settings = settings
        self.group = group
        self.topics = list(topics)
        self.interval_s = interval_s
        self.lag = Gauge("inflight_kafka_consumer_lag",
                         "end offset - committed offset of the consumer group, per partition "
                         "(indicative only on the embedded broker)",
                         ["group", "topic", "partition"], registry=registry)
        self.committed = Gauge("inflight_kafka_committed_offset", "committed offset per partition",
                               ["group", "topic", "partition"], registry=registry)
        self.end = Gauge("inflight_kafka_end_offset", "log end offset per partition",
                         ["group", "topic", "partition"], registry=registry)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._admin: KafkaAdminClient | None = None
        self._consumer: KafkaConsumer | None = None

    def start(self) -> "LagProbe":
        self._thread = threading.Thread(target=self._run, name=f"lag-{self.group}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.probe()
            except Exception as exc:  # noqa: BLE001 - a metric must never take the service down
                log.debug("consumer lag probe failed: %s", exc)
            self._stop.wait(self.interval_s)
        self._close_clients()

    def probe(self) -> dict[TopicPartition, int]:
        """Read committed and end offsets once; set the gauges; returns lag per partition."""
        if self._admin is None:
            self._admin = connect(KafkaAdminClient, self.settings, client_id=f"{self.group}-lag")
            self._consumer = connect(KafkaConsumer, self.settings, group_id=None,
                                     enable_auto_commit=False)
        parts = [TopicPartition(t, p) for t in self.topics
                 for p in sorted(self._consumer.partitions_for_topic(t) or ())]
        if not parts:
            self._consumer.topics()  # refresh metadata; the next probe sees them
            return {}
        offsets = self._admin.list_group_offsets({self.group: parts}).get(self.group, {})
        committed = {tp: meta.offset for tp, meta in offsets.items() if meta is not None}
        ends = self._consumer.end_offsets(parts)
        lags = {}
        for tp in parts:
            end = ends.get(tp)
            done = committed.get(tp, -1)
            labels = (self.group, tp.topic, str(tp.partition))
            if end is not None:
                self.end.labels(*labels).set(end)
            self.committed.labels(*labels).set(max(done, 0))
            if end is not None:
                lags[tp] = end - max(done, 0)
                self.lag.labels(*labels).set(lags[tp])
        return lags

    def _close_clients(self) -> None:
        for client in (self._consumer, self._admin):
            if client is not None:
                try:
                    client.close()
                except Exception:  # noqa: BLE001
                    log.debug("closing a lag client failed", exc_info=True)
        self._consumer = self._admin = None

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        else:
            self._close_clients()


__all__ = ["LagProbe"]
