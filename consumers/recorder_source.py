"""What the recorder reads with: a group consumer that hands back plain (offset, value)
records by partition and commits given offsets, on librdkafka (confluent-kafka) or
kafka-python, as INFLIGHT_KAFKA_RECORDER_CONSUMER says.

    poll(timeout_s, max_records) ─► {TopicPartition: [(offset, value, headers), ...]}
    commit({TopicPartition: next offset})     (synchronous; KafkaError when refused)
    assignment() ─► {TopicPartition}           close()

NOTE (why librdkafka): kafka-python fetched and parsed records in Python (the largest part
of the recorder's CPU) and fetched only when asked, so every batch waited for a round
trip; librdkafka prefetches and parses in C threads. The recorder reads one header, the
traceparent (its trace id goes with the row), and never needs it: records kafka-python
could not parse (transport.kafka_records) are nothing special here.
"""

from __future__ import annotations

import logging
from typing import Any

from kafka import TopicPartition
from kafka.errors import KafkaError
from kafka.structs import OffsetAndMetadata

from inflight.consumers.kafka_io import group_consumer
from inflight.transport.kafka_clients import group_config
from inflight.schemas.settings import Settings

log = logging.getLogger("inflight.recorder")

Records = dict[TopicPartition, list[tuple[int, Any]]]


def recorder_source(settings: Settings, group: str, topics: list[str],
                    max_records: int) -> RdSource | KafkaPythonSource:
    if settings.kafka_recorder_consumer == "kafka-python":
        return KafkaPythonSource(settings, group, topics, max_records)
    return RdSource(settings, group, topics)


class RdSource:
    def __init__(self, settings: Settings, group: str, topics: list[str]):
        from confluent_kafka import Consumer

        config: dict[str, Any] = {
            **settings.rdkafka_common(),
            **group_config(settings, group),
            "logger": logging.getLogger("inflight.rdkafka"),
        }
        config.update(settings.kafka_rdkafka_options)
        self._c = Consumer(config)
        self._c.subscribe(topics)

    def poll(self, timeout_s: float, max_records: int) -> Records:
        """What has arrived, up to `max_records`; waits up to `timeout_s` only while nothing
        has (librdkafka's consume() alone would wait for a full batch)."""
        c = self._c
        msgs = c.consume(max_records, 0)
        if not msgs:
            msgs = c.consume(1, timeout_s)
            if msgs and max_records > 1:
                msgs += c.consume(max_records - 1, 0)
        out: Records = {}
        for m in msgs:
            err = m.error()
            if err is not None:  # a consumer-level event (partition EOFs are off)
                log.warning("the recorder's consumer: %s", err)
                continue
            tp = TopicPartition(m.topic(), m.partition())
            recs = out.get(tp)
            if recs is None:
                recs = out[tp] = []
            recs.append((m.offset(), m.value(), _headers(m)))
        return out

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition(tp.topic, tp.partition) for tp in self._c.assignment()}

    def commit(self, offsets: dict[TopicPartition, int]) -> None:
        from confluent_kafka import KafkaException
        from confluent_kafka import TopicPartition as RdTopicPartition

        try:
            self._c.commit(offsets=[RdTopicPartition(tp.topic, tp.partition, off)
                                    for tp, off in offsets.items()], asynchronous=False)
        except KafkaException as exc:
            raise KafkaError(str(exc.args[0])) from None

    def close(self) -> None:
        self._c.close()  # leaves the group; commits nothing (auto commit is off)


def _headers(m: Any) -> list | None:
    """A message's headers, or None when confluent-kafka cannot give them.

    NOTE: a header key that is not UTF-8 makes Message.headers() leave a UnicodeDecodeError
    set while returning, which surfaced as a SystemError at the next checked call of a
    built-in (and stopped the loop). One such call inside the same try raises it here."""
    try:
        hs = m.headers()
        tuple.__new__(tuple, ())  # a checked built-in call: raises a pending error now
        return hs
    except (UnicodeDecodeError, SystemError):
        return None


class KafkaPythonSource:
    def __init__(self, settings: Settings, group: str, topics: list[str], max_records: int):
        self._c = group_consumer(settings, group, max_poll_records=max_records)
        self._c.subscribe(topics)

    def poll(self, timeout_s: float, max_records: int) -> Records:
        batch = self._c.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        return {tp: [(r.offset, r.value, r.headers) for r in recs] for tp, recs in batch.items()}

    def assignment(self) -> set[TopicPartition]:
        return set(self._c.assignment())

    def commit(self, offsets: dict[TopicPartition, int]) -> None:
        self._c.commit({tp: OffsetAndMetadata(off, "", -1) for tp, off in offsets.items()})

    def close(self) -> None:
        self._c.close(autocommit=False)
