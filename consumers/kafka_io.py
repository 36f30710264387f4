"""What only the consumers need of Kafka: the group consumer, and a bounded id set.
(Producers, plain consumers and partition lookups: transport.kafka_clients.)"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

from kafka import KafkaConsumer

from inflight.transport.kafka_clients import connect, group_config, kafka_python_names
from inflight.schemas.settings import Settings


def group_consumer(settings: Settings, group: str, **overrides: Any) -> KafkaConsumer:
    """A kafka-python consumer in `group` with transport.kafka_clients.group_config (manual
    commits, earliest offset for a new group) and INFLIGHT_KAFKA_PYTHON_FETCH_MAX_WAIT_MS;
    `overrides` in kafka-python's names."""
    opts = kafka_python_names(group_config(settings, group))
    opts["fetch_max_wait_ms"] = settings.kafka_python_fetch_max_wait_ms
    opts.update(overrides)
    return connect(KafkaConsumer, settings, **opts)


def close_without_leaving(consumer: KafkaConsumer) -> None:
    """Close a group consumer without a LeaveGroup request: the group moves its partitions
    when its session expires (session.timeout.ms), not at once.

    NOTE (why): on Tansu, a member that leaves while another member's join is under way
    wedges the group for good: every later joiner is told to follow the departed leader and
    never gets a partition, even after all members left (reproduced with bare kafka-python
    consumers in tests/consumers/test_group_recovery.py). A member whose session expires
    instead is handled: the rebalance completes without it. The cost is one session
    timeout before an idle group takes over a stopped worker's partitions; a worker that
    joins during a drain gets them at once (the draining worker polls and takes part).
    kafka-python has no option for it: a member whose generation is reset sends none."""
    coordinator = getattr(consumer, "_coordinator", None)
    reset = getattr(coordinator, "reset_generation", None)
    if reset is not None:
        reset()
    consumer.close(autocommit=False)


class LRUSet:
    """A bounded set that forgets the oldest entries first."""

    def __init__(self, maxlen: int):
        self.maxlen = maxlen
        self._d: OrderedDict[Hashable, None] = OrderedDict()

    def add(self, key: Hashable) -> None:
        self._d[key] = None
        self._d.move_to_end(key)
        while len(self._d) > self.maxlen:
            self._d.popitem(last=False)

    def discard(self, key: Hashable) -> None:
        self._d.pop(key, None)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._d

    def __len__(self) -> int:
        return len(self._d)
