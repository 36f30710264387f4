"""The worker's librdkafka producer (transport/librdkafka_producer.py) on the real broker: tracked
sends report success and failure like kafka-python's futures; untracked sends report
failures only; refusals arrive as the kafka-python errors consumers.tracked_sends sorts on."""

from __future__ import annotations

import pytest
from kafka.errors import KafkaError, MessageSizeTooLargeError

from tests.consumers.conftest import make_settings

pytestmark = [pytest.mark.broker]


def test_tracked_and_untracked_sends_report_as_kafka_python_does(broker, tmp_path):
    from inflight.transport.librdkafka_producer import RdProducer

    settings = make_settings(broker, f"sqlite:///{tmp_path / 'x.db'}", partitions=1,
                             kafka_max_message_bytes=10_000)
    p = RdProducer(settings)
    try:
        acked, failed = [], []
        fut = p.send(settings.topic_results, key=b"a", value=b"x")
        fut.add_callback(acked.append).add_errback(failed.append)
        assert fut.get(timeout=30) is not None and len(acked) == 1 and not failed
        assert p.partitions_for(settings.topic_results) == {0}

        with pytest.raises(MessageSizeTooLargeError):  # over message.max.bytes: refused at once
            p.send(settings.topic_results, key=b"b", value=b"x" * 100_000)

        errors: list = []
        p.send_untracked(settings.topic_results_tokens, b"c", b"fine", 0, errors.append)
        try:  # a partition the topic lacks: refused at once, or in a delivery report
            p.send_untracked(settings.topic_results_tokens, b"d", b"lost", 7, errors.append)
        except KafkaError as exc:
            errors.append(exc)
        p.flush(30)
        p.poll_acks(0)
        assert len(errors) == 1 and isinstance(errors[0], KafkaError)
    finally:
        p.close(5)
