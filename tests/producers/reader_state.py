"""What tests read of a ResultsReader's insides (the service itself never asks)."""

from __future__ import annotations

import time

from inflight.producers.results_reader import ResultsReader


def followed(reader: ResultsReader) -> int:
    """Follows open now (registered and not closed)."""
    return reader._count


def wait_ready(reader: ResultsReader, timeout: float) -> bool:
    """True once the reader has located its partitions (within `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if reader._consumer is not None and not reader._unresolved:
            return True
        time.sleep(0.01)
    return False
