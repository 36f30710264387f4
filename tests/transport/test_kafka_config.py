"""The producer and group settings written once in Kafka's names are valid settings of
both clients: kafka-python's keywords after `kafka_python_names`, librdkafka's as they are."""

from __future__ import annotations

from kafka import KafkaConsumer, KafkaProducer

from inflight.schemas import Settings
from inflight.transport.kafka_clients import group_config, kafka_python_names, producer_config


def test_kafka_python_knows_every_translated_name():
    s = Settings(kafka_max_message_bytes=2_000_000)
    consumer = kafka_python_names(group_config(s, "g"))
    producer = kafka_python_names(producer_config(s))
    assert set(consumer) <= set(KafkaConsumer.DEFAULT_CONFIG)
    assert set(producer) <= set(KafkaProducer.DEFAULT_CONFIG)
    assert consumer["group_id"] == "g" and consumer["enable_auto_commit"] is False
    assert producer["max_request_size"] == 2_064_000  # librdkafka's message.max.bytes


def test_librdkafka_accepts_the_same_settings():
    from confluent_kafka import Consumer, Producer

    s = Settings()
    # no broker is contacted: the clients are made (config checked) and closed at once
    Consumer({"bootstrap.servers": "127.0.0.1:9", **group_config(s, "g")}).close()
    Producer({"bootstrap.servers": "127.0.0.1:9", **producer_config(s)}).flush(0)
