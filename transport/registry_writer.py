"""Announcing what a worker serves on the model registry (schemas/registry.py): its record at
start, again every INFLIGHT_REGISTRY_HEARTBEAT_S (a new `heartbeat_at`), a tombstone when it
stops serving.

    announcer = RegistryAnnouncer(settings, records)   # the worker's records, heartbeat 0
    announcer.beat()      # from the worker's loop: sends when due (a clock read otherwise)
    announcer.withdraw()  # graceful stop: a tombstone per record, flushed

Its own librdkafka producer (sends in C threads, off the worker's hot path). A send that
fails is logged (once per failure streak) and the next beat tries again: a worker that
cannot reach the registry still serves its topics; readers drop it after their TTL.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from inflight.schemas.codec import encode
from inflight.schemas.registry import ModelRecord
from inflight.schemas.settings import Settings
from inflight.schemas.headers import message_headers

_HEADERS = message_headers()  # content-type, schema-version (schemas/headers.py)
log = logging.getLogger("inflight.registry")

WITHDRAW_TIMEOUT_S = 5.0


class RegistryAnnouncer:
    def __init__(self, settings: Settings, records: Sequence[ModelRecord]):
        from confluent_kafka import Producer

        self.topic = settings.topic_models
        self.interval_s = settings.registry_heartbeat_s
        self.records = list(records)
        self.sent = 0
        self._next = 0.0
        self._failing = False
        self._producer = Producer({**settings.rdkafka_common(), "linger.ms": 0,
                                   "logger": logging.getLogger("inflight.rdkafka"),
                                   **settings.kafka_rdkafka_options})

    def beat(self, force: bool = False) -> bool:
        """Send every record with a fresh heartbeat when one is due (or `force`); True
        when it sent."""
        now = time.monotonic()
        if not force and now < self._next:
            return False
        self._next = now + self.interval_s
        at = time.time()
        for record in self.records:
            value = encode(record.model_copy(update={"heartbeat_at": at}))
            self._send(record.key, value)
        self._producer.poll(0)
        return True

    def withdraw(self, timeout: float = WITHDRAW_TIMEOUT_S) -> None:
        """Tombstones for every record (this worker stops serving), delivered within
        `timeout` seconds if the broker answers."""
        for record in self.records:
            self._send(record.key, None)
        left = self._producer.flush(timeout)
        if left:
            log.warning("registry: %d tombstone(s) not delivered; readers drop this worker "
                        "after INFLIGHT_REGISTRY_TTL_S", left)

    def _send(self, key: bytes, value: bytes | None) -> None:
        try:
            self._producer.produce(self.topic, value, key, on_delivery=self._delivered,
                                   headers=_HEADERS)
            self.sent += 1
        except Exception as exc:  # noqa: BLE001 - BufferError & co: never fatal to the worker
            self._failed(exc)

    def _delivered(self, err: Any, _msg: Any) -> None:
        if err is None:
            if self._failing:
                log.info("registry: announcing on %s again", self.topic)
            self._failing = False
        else:
            self._failed(err)

    def _failed(self, err: Any) -> None:
        if not self._failing:
            log.warning("registry: could not announce on %s (%s); trying again every %gs",
                        self.topic, err, self.interval_s)
        self._failing = True
