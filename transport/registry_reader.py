"""Following the model registry (schemas/registry.py): one reader per process (the API, a
Client that routes by model, the batch jobs, `inflight models`, a worker at start).

    inflight.models (1 partition) ─► consumer from offset 0, never stops ─► {key: record}
                                        ▲
    probe: a tombstone under a key of the reader's own ─┘  read back = caught up

NOTE (why a probe, and never end offsets): the embedded broker (Tansu) answers end offsets,
"latest" and lag wrongly, so "have I read what was there when I started?" cannot be asked
of offsets. The reader writes a tombstone (a null value: nothing to compact away later)
under a key of its own and reads the log from its first offset; once that tombstone comes
back, everything written before it has been read. `wait_ready()` waits for that; a probe
that does not come back within PROBE_AGAIN_S is sent again.

Records live while their `heartbeat_at` is within INFLIGHT_REGISTRY_TTL_S of now (`live`);
a tombstone drops its key at once. A record that is not a ModelRecord is logged and
skipped: no record stops the reader.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

from inflight.schemas.errors import BrokerError, SchemaError
from inflight.schemas.registry import ModelRecord, decode_record
from inflight.schemas.settings import Settings

if TYPE_CHECKING:
    from confluent_kafka import Consumer, Producer

log = logging.getLogger("inflight.registry")

POLL_S = 0.1
RETRY_S = 1.0          # the broker or the topic not there: try again this often
PROBE_AGAIN_S = 5.0    # a probe not read back by then is sent again
LOOKUP_TIMEOUT_S = 5.0
PROBE_PREFIX = "probe "


class RegistryReader:
    def __init__(self, settings: Settings, *, name: str = "registry"):
        self.settings = settings
        self.topic = settings.topic_models
        self.name = name
        self.error: str | None = None     # why the registry cannot be read now
        self.records_read = 0
        self._records: dict[bytes, ModelRecord] = {}
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None
        self._probe: bytes | None = None
        self._probe_at = 0.0
        self._bad_keys: set[bytes] = set()

    # -- what readers ask -----------------------------------------------------------------
    def start(self) -> "RegistryReader":
        with self._lock:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name=f"{self.name}-reader",
                                                daemon=True)
                self._thread.start()
        return self

    @property
    def ready(self) -> bool:
        """The log has been read up to this reader's probe at least once."""
        return self._ready.is_set()

    def wait_ready(self, timeout: float) -> bool:
        """Wait (at most `timeout` seconds) until the reader has caught up once."""
        self.start()
        return self._ready.wait(timeout)

    def records(self) -> list[ModelRecord]:
        """Every record read (live or not), last value per key."""
        with self._lock:
            return list(self._records.values())

    def live(self, now: float | None = None) -> list[ModelRecord]:
        """The records whose heartbeat is within INFLIGHT_REGISTRY_TTL_S of `now`."""
        cutoff = (time.time() if now is None else now) - self.settings.registry_ttl_s
        return [r for r in self.records() if r.heartbeat_at >= cutoff]

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=10)

    # -- the reader thread -------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._consumer is None:
                    self._connect()
                self._maybe_probe()
                msg = self._consumer.poll(POLL_S)
                while msg is not None:
                    self._take(msg)
                    msg = self._consumer.poll(0)
                if self._producer is not None:
                    self._producer.poll(0)
            except BrokerError as exc:
                if self.error != str(exc):
                    log.warning("%s reader: %s; trying again", self.name, exc)
                self.error = str(exc)
                self._stop.wait(RETRY_S)
            except Exception as exc:  # noqa: BLE001 - the reader serves its process: never dies
                log.exception("%s reader: unexpected error; going on", self.name)
                self.error = f"{type(exc).__name__}: {exc}"
                self._stop.wait(RETRY_S)
        self._close_clients()

    def _connect(self) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

        s = self.settings
        consumer = Consumer({
            **s.rdkafka_common(),
            # NOTE: librdkafka wants a group id; this one is never joined nor committed to
            "group.id": f"inflight-{self.name}-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False, "enable.auto.offset.store": False,
            "fetch.wait.max.ms": s.kafka_fetch_max_wait_ms,
            "client.id": f"inflight-{self.name}",
            "logger": logging.getLogger("inflight.rdkafka"),
            **s.kafka_rdkafka_options})
        try:
            try:
                md = consumer.list_topics(self.topic, timeout=LOOKUP_TIMEOUT_S)
            except KafkaException as exc:
                raise BrokerError(f"Kafka at {s.kafka_bootstrap!r} did not answer "
                                  f"({exc.args[0]})") from None
            t = md.topics.get(self.topic)
            if t is None or t.error is not None or not t.partitions:
                raise BrokerError(f"the registry topic {self.topic!r} does not exist: run "
                                  "`inflight topics create` (or start a worker)")
            consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING)
                             for p in sorted(t.partitions)])
        except BaseException:
            consumer.close()
            raise
        self._consumer = consumer
        self.error = None

    def _maybe_probe(self) -> None:
        if self._ready.is_set() or time.monotonic() < self._probe_at + PROBE_AGAIN_S:
            return
        from confluent_kafka import Producer

        if self._producer is None:
            self._producer = Producer({**self.settings.rdkafka_common(),
                                       "linger.ms": 0, "logger": logging.getLogger("inflight.rdkafka"),
                                       **self.settings.kafka_rdkafka_options})
        self._probe = f"{PROBE_PREFIX}{self.name} {uuid.uuid4().hex}".encode()
        self._probe_at = time.monotonic()
        self._producer.produce(self.topic, None, self._probe)
        self._producer.poll(0)

    def _take(self, msg: Any) -> None:
        if msg.error() is not None:
            log.debug("%s reader: %s", self.name, msg.error())
            return
        key, value = msg.key(), msg.value()
        self.records_read += 1
        if key is None:
            return
        if key == self._probe:
            self._ready.set()
            self._probe = None
            self._drop_producer()
            return
        if value is None:
            with self._lock:
                self._records.pop(key, None)
            return
        if key.startswith(PROBE_PREFIX.encode()):
            return
        try:
            record = decode_record(value)
        except SchemaError as exc:
            if key not in self._bad_keys:
                self._bad_keys.add(key)
                log.warning("%s reader: skipped a record under %r that is not a model "
                            "record: %s", self.name, key[:200], exc.message)
            return
        with self._lock:
            self._records[key] = record

    def _drop_producer(self) -> None:
        if self._producer is not None:
            self._producer.flush(1)
            self._producer = None

    def _close_clients(self) -> None:
        for close in (self._consumer and self._consumer.close, self._drop_producer):
            if close:
                try:
                    close()
                except Exception:  # noqa: BLE001 - closing must not mask anything
                    log.debug("closing the registry reader failed", exc_info=True)
        self._consumer = None
