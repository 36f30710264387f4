"""One reader of the results topics per process, for every request the process follows.

    API handlers, Client.stream / Client.wait ─► follow(request_id, since) ─► own queue
                                                                               ▲
    inflight.results.tokens ─┐                                                 │
                             ├─► one consumer (librdkafka) ─► key ─► assembler ┘
    inflight.results ────────┘   every partition, from when the reader started

Thousands of followed requests cost one Kafka consumer, not one each: a record is matched
by its key (the request id) and decoded only when someone follows it; each follow has its
own StreamAssembler (producers/stream.py: deltas in order, attempts never mixed) and
queue (producers/follow.py). The number of follows is capped (`max_follows`): each holds
its assembler and the events its follower has not taken yet.

Where reading starts: at the first offset stamped at or after the reader's start (minus
SLACK_S for other hosts' clocks), by `offsets_for_times`, never "latest" (wrong on Tansu);
a partition with nothing stamped that late yet is looked up again until it has.

Following late (`since`: no event of the request was appended before this instant): the
reader keeps checkpoints of how far it had read each partition, and when. A follow whose
`since` is at or after a checkpoint replays from that checkpoint's offsets; an older one
from the broker's `offsets_for_times(since - SLACK_S)`. Replaying rewinds the partition
for the reader (the records read again cost a key lookup; the assembler drops what a
follow already had). A follow registered before its request was published (`since` None)
replays nothing: no event of it can be older than the follow.

NOTE (Tansu): its `offsets_for_times` answers offset 0 where nothing is stamped at or
after the time (Kafka answers -1): the partition is read from its start, which is correct,
only slower; the checkpoints spare most late follows the lookup.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import logging
import queue
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any, TypeVar

from inflight.schemas import SchemaError, Settings, decode_result
from inflight.schemas.errors import BrokerError, CapacityError
from inflight.transport.partitioner import partition_for

from inflight.producers.follow import AsyncFollow, Follow, SyncFollow

if TYPE_CHECKING:
    from confluent_kafka import Consumer, Message

log = logging.getLogger("inflight.results")

SLACK_S = 5.0               # broker lookups start this much early (other hosts' clocks)
POLL_S = 0.05               # the longest the reader waits for records before looking round
BATCH = 2000                # records taken from librdkafka at once
FINE_EVERY_S, FINE_KEPT = 0.05, 200         # checkpoints: the last 10 s, finely
COARSE_EVERY_S, COARSE_KEPT = 5.0, 720      # ... and the last hour
RESOLVE_IDLE_S = 1.0        # a partition not located yet: look again this often...
RESOLVE_FOLLOWED_S = 0.02   # ... or this often while anything is followed
LOOKUP_TIMEOUT_S = 2.0
RETRY_S = 1.0               # the broker unreachable: try again this often

TP = tuple[str, int]
F = TypeVar("F", bound=Follow)


class ResultsReader:
    def __init__(self, settings: Settings, *, max_follows: int, name: str = "results"):
        self.settings = settings
        self.max_follows = max_follows
        self.name = name
        self.topics = (settings.topic_results_tokens, settings.topic_results)
        self.created_at = time.time()
        self.error: str | None = None        # why the reader cannot read now
        self.records = 0                     # records read
        self.rewinds = 0                     # partitions rewound for late follows
        self._lock = threading.Lock()
        self._by_key: dict[bytes, list[Follow]] = {}
        self._count = 0
        self._late: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._consumer: Consumer | None = None
        self._nparts: dict[str, int] = {}
        self._pos: dict[TP, int] = {}        # next offset to read, per located partition
        self._unresolved: set[TP] = set()
        self._next_resolve = 0.0
        self._fine: collections.deque = collections.deque(maxlen=FINE_KEPT)
        self._coarse: collections.deque = collections.deque(maxlen=COARSE_KEPT)
        self._last_fine = self._last_coarse = 0.0

    # -- following (any thread) -------------------------------------------------------------
    def follow(self, request_id: str, since: float | None = None) -> SyncFollow:
        """Follow one request from a thread. `since`: no event of it was appended before
        this instant (epoch seconds, this host's clock: give a foreign time early enough);
        None: the request is published after this call."""
        return self._register(SyncFollow(self, request_id, since))

    def follow_async(self, request_id: str, since: float | None = None) -> AsyncFollow:
        """The same, for the running event loop."""
        return self._register(AsyncFollow(self, request_id, since, asyncio.get_running_loop()))

    def _register(self, f: F) -> F:
        self.start()
        with self._lock:
            if self._closed:
                raise BrokerError("the results reader is closed")
            if self._consumer is None and self.error is not None:
                raise BrokerError(f"cannot read the results topics: {self.error}")
            if self._count >= self.max_follows:
                raise CapacityError(f"{self._count} requests are followed already, the most "
                                    f"this process allows ({self.max_follows})")
            self._count += 1
            self._by_key.setdefault(f.key, []).append(f)
        if f.since is not None:
            self._late.put(f)
        return f

    def unfollow(self, f: Follow) -> None:
        with self._lock:
            self._count -= 1
            self._drop(f)

    def _drop(self, f: Follow) -> None:
        fs = self._by_key.get(f.key)
        if fs is not None and f in fs:
            fs.remove(f)
            if not fs:
                del self._by_key[f.key]

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> "ResultsReader":
        with self._lock:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name=f"{self.name}-reader",
                                                daemon=True)
                self._thread.start()
        return self

    def close(self) -> None:
        with self._lock:
            self._closed = True
            thread, self._thread = self._thread, None
            follows = [f for fs in self._by_key.values() for f in fs]
            self._by_key.clear()
        self._stop.set()
        if thread is not None:
            thread.join(timeout=10)
        gone = BrokerError("the results reader closed")
        for f in follows:
            f.fail(gone)
        self._wake(follows)

    # -- the reader thread ---------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._consumer is None:
                    self._connect()
                self._replay_late()
                self._resolve()
                msgs = self._take()
                if msgs:
                    self._dispatch(msgs)
                self._checkpoint()
            except BrokerError as exc:
                if self.error != str(exc):
                    log.warning("%s reader: %s; trying again", self.name, exc)
                self.error = str(exc)
                self._stop.wait(RETRY_S)
            except Exception as exc:  # noqa: BLE001 - the reader serves every follow: never dies
                log.exception("%s reader: unexpected error; going on", self.name)
                if self._consumer is None:   # e.g. a librdkafka setting it refuses
                    self.error = f"{type(exc).__name__}: {exc}"
                self._stop.wait(RETRY_S)
        if self._consumer is not None:
            try:
                self._consumer.close()
            except Exception:  # noqa: BLE001 - closing must not mask anything
                log.debug("closing the results consumer failed", exc_info=True)
            self._consumer = None

    def _take(self) -> list[Message]:
        """What has arrived (up to BATCH); waits up to POLL_S only while nothing has.
        NOTE: librdkafka's consume(n, timeout) waits for n records or the whole timeout."""
        c = self._consumer
        msgs = c.consume(BATCH, 0)
        if not msgs:
            msgs = c.consume(1, POLL_S)
            if msgs:
                msgs += c.consume(BATCH - 1, 0)
        return msgs

    def _connect(self) -> None:
        from confluent_kafka import Consumer, KafkaException

        s = self.settings
        config: dict[str, Any] = {
            **s.rdkafka_common(),
            # NOTE: librdkafka wants a group id; this one is never joined nor committed to
            "group.id": f"inflight-{self.name}-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False, "enable.auto.offset.store": False,
            "fetch.wait.max.ms": s.kafka_fetch_max_wait_ms,
            "fetch.max.bytes": max(s.kafka_max_message_bytes * 4, 4_000_000),
            "max.partition.fetch.bytes": s.kafka_max_message_bytes + 64_000,
            "client.id": f"inflight-{self.name}",
            "logger": logging.getLogger("inflight.rdkafka"),
        }
        config.update(s.kafka_rdkafka_options)
        consumer = Consumer(config)
        try:
            nparts = {}
            for topic in self.topics:
                try:
                    md = consumer.list_topics(topic, timeout=LOOKUP_TIMEOUT_S)
                except KafkaException as exc:
                    raise BrokerError(f"Kafka at {s.kafka_bootstrap!r} did not answer "
                                      f"({exc.args[0]})") from None
                t = md.topics.get(topic)
                if t is None or t.error is not None or not t.partitions:
                    raise BrokerError(f"topic {topic!r} does not exist: run "
                                      "`inflight topics create`")
                nparts[topic] = len(t.partitions)
        except BaseException:
            consumer.close()
            raise
        self._consumer, self._nparts = consumer, nparts
        self._unresolved = {(t, p) for t in self.topics for p in range(nparts[t])}
        self._next_resolve = 0.0
        self.error = None
        log.info("%s reader: %s", self.name, ", ".join(f"{t} ({n} partitions)"
                                                       for t, n in nparts.items()))

    def _lookup(self, times: dict[TP, int]) -> dict[TP, int]:
        """offsets_for_times: {partition: first offset stamped at or after the time, or -1}."""
        from confluent_kafka import KafkaException, TopicPartition

        try:
            found = self._consumer.offsets_for_times(
                [TopicPartition(t, p, ms) for (t, p), ms in times.items()],
                timeout=LOOKUP_TIMEOUT_S)
        except KafkaException as exc:
            log.warning("%s reader: offsets_for_times failed (%s); trying again", self.name,
                        exc.args[0])
            return {}
        return {(tp.topic, tp.partition): tp.offset for tp in found if tp.error is None}

    def _assign(self, tp: TP, offset: int) -> None:
        from confluent_kafka import TopicPartition

        if tp in self._pos:
            self._consumer.incremental_unassign([TopicPartition(*tp)])
        self._consumer.incremental_assign([TopicPartition(tp[0], tp[1], offset)])
        self._pos[tp] = offset
        self._unresolved.discard(tp)

    def _resolve(self) -> None:
        now = time.monotonic()
        if not self._unresolved or now < self._next_resolve:
            return
        self._next_resolve = now + (RESOLVE_FOLLOWED_S if self._count else RESOLVE_IDLE_S)
        start_ms = int((self.created_at - SLACK_S) * 1000)
        for tp, offset in self._lookup({tp: start_ms for tp in self._unresolved}).items():
            if offset >= 0:
                self._assign(tp, offset)

    def _partitions_of(self, request_id: str) -> list[TP]:
        return [(t, partition_for(request_id, self._nparts[t])) for t in self.topics]

    def _replay_late(self) -> None:
        """Rewind the partitions of the follows registered late to where their events
        may start (one rewind per partition for all of them)."""
        want: dict[TP, int] = {}
        ask: dict[TP, int] = {}
        while True:
            try:
                f = self._late.get_nowait()
            except queue.Empty:
                break
            if f.closed:
                continue
            for tp in self._partitions_of(f.request_id):
                offset = None if tp in self._unresolved else self._checkpoint_offset(tp, f.since)
                if offset is None:
                    ms = int((f.since - SLACK_S) * 1000)
                    ask[tp] = min(ask.get(tp, ms), ms)
                else:
                    want[tp] = min(want.get(tp, offset), offset)
        if ask:
            for tp, offset in self._lookup(ask).items():
                if offset >= 0:
                    want[tp] = min(want.get(tp, offset), offset)
        for tp, offset in want.items():
            if tp in self._unresolved or offset < self._pos[tp]:
                self._assign(tp, offset)
                self.rewinds += 1

    def _checkpoint(self) -> None:
        now = time.time()
        if now - self._last_fine >= FINE_EVERY_S:
            self._last_fine = now
            self._fine.append((now, dict(self._pos)))
            if now - self._last_coarse >= COARSE_EVERY_S:
                self._last_coarse = now
                self._coarse.append((now, self._fine[-1][1]))

    def _checkpoint_offset(self, tp: TP, since: float) -> int | None:
        """How far the partition had been read at the last checkpoint taken at or before
        `since` (every record appended after that instant lies beyond); None: no such
        checkpoint, or the partition was not located then."""
        for t, pos in reversed(self._fine):
            if t <= since:
                return pos.get(tp)
        i = bisect.bisect_right([t for t, _ in self._coarse], since)
        return self._coarse[i - 1][1].get(tp) if i else None

    def _dispatch(self, msgs: list[Message]) -> None:
        pos, tokens_topic = self._pos, self.topics[0]
        deltas: list[tuple[list[Follow], bytes]] = []
        others: list[tuple[list[Follow], bytes]] = []
        with self._lock:
            by_key = self._by_key
            for m in msgs:
                if m.error() is not None:
                    log.debug("%s reader: %s", self.name, m.error())
                    continue
                topic = m.topic()
                pos[(topic, m.partition())] = m.offset() + 1
                fs = by_key.get(m.key())
                if fs:
                    (deltas if topic == tokens_topic else others).append((list(fs), m.value()))
        self.records += len(msgs)
        touched: list[Follow] = []
        finished: list[Follow] = []
        # deltas first: a request's final is sent after its deltas, on the other topic
        for fs, value in deltas + others:
            try:
                event = decode_result(value)
            except SchemaError:
                continue
            for f in fs:
                if f.closed or f.assembler.done:
                    continue
                out = f.assembler.feed(event)
                if out:
                    f.push(out)
                    touched.append(f)
                if f.assembler.done:
                    finished.append(f)
        if finished:
            with self._lock:
                for f in finished:
                    self._drop(f)
        if touched:
            self._wake(touched)

    @staticmethod
    def _wake(follows: list[Follow]) -> None:
        """Wake the async follows, once per event loop for all of its follows."""
        loops: dict[asyncio.AbstractEventLoop, list[AsyncFollow]] = {}
        for f in follows:
            if isinstance(f, AsyncFollow):
                loops.setdefault(f.loop, []).append(f)
        for loop, fs in loops.items():
            try:
                loop.call_soon_threadsafe(_wake_all, fs)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass


def _wake_all(follows: list[AsyncFollow]) -> None:
    for f in follows:
        f.wake()
