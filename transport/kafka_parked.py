"""kafka-python's fetcher: a partition paused with fetched records in hand is read again
once it is resumed.

kafka-python 3 parks the records of a partition paused after they were fetched
(Fetcher._paused_partition_records, its port of KAFKA-7548) and gives them back when the
partition is resumed, but only while no other partition's records sit "in line"
(`_next_partition_records is None`). Records in line that were thrown away (`drain()`:
they were from before a seek, or their partition was paused) stay there as an empty,
falsy object that is never cleared, so the parked records are never given back, and the
fetcher never fetches that partition again either (it has records in hand): the
partition stalls for good. The worker's intake pauses, resumes and seeks its partitions
all the time (consumers/intake.py: admission closed, batch topic behind interactive
traffic, records put back), and with a short fetch wait it met this within minutes: a
batch topic partition stopped being read (tests/transport/test_kafka_parked.py reproduces
it with a bare consumer). `install()` clears spent records in line before each
`fetched_records`, which is what the fetcher does itself when it finishes them.
"""

from __future__ import annotations

import threading
from typing import Any

from kafka.consumer import fetcher

from inflight.transport.kafka_wrap import wrap_method

_lock = threading.Lock()
_MARK = "_inflight_unparks"


def install() -> bool:
    """Wrap Fetcher.fetched_records (idempotent); False if kafka-python has changed."""

    def wrap(original: Any) -> Any:
        def fetched_records(self: Any, *args: Any, **kwargs: Any) -> Any:
            current = getattr(self, "_next_partition_records", None)
            if current is not None and not current:  # spent: thrown away, never cleared
                self._next_partition_records = None
            return original(self, *args, **kwargs)
        return fetched_records

    with _lock:
        return wrap_method(fetcher.Fetcher, "fetched_records", wrap, mark=_MARK,
                           changed="kafka-python's Fetcher has changed: a paused partition "
                                   "may stall (transport/kafka_parked.py)")
