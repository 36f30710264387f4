"""What the worker's three threads hand each other (see consumers/worker.py for the picture).

Everything here is built by one thread and only read after it is handed over: no locks
(but in Slots, which two threads share).

    intake ──Admit/Reject/Final/HandBack──► publisher ◄──step outputs── engine loop
       │                                       │                           ▲
       └──────────────Add/Abort───────────────-┼───────────────────────────┘
       ▲                                       │
       └──────── ticket states ────────────────┘  (finished in the engine; acked; dropped)

A *ticket* numbers one unit of work whose ending settles offsets: an admitted request, or
a rejected message. An *attempt* names one admission of a request on the wire and in the
engine (the engine's request id), so a request redone after a rebalance never collides
with an earlier, aborting copy of itself.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Admitted:
    """A request the intake admitted; the publisher needs this to write its events."""

    ticket: int
    request_id: str
    attempt: str
    stream: bool
    batch_id: str | None
    submitted_at: float | None
    queued_at: float
    source: str                              # "topic/partition/offset", for DLQ headers
    raw: bytes | None = None                 # the request as received, for the DLQ should the
    headers: list[tuple[Any, Any]] = field(default_factory=list)  # engine refuse its input
    key: bytes | None = None
    tools: bool = False                      # read tool calls out of the answer


@dataclass(slots=True)
class Rejected:
    """A message that will not run: an ErrorEvent final, plus its raw copy on the DLQ."""

    ticket: int
    request_id: str | None
    code: str
    message: str
    field: str | None
    batch_id: str | None
    source: str
    raw: bytes | None                        # None: no DLQ copy (the engine's own failure)
    headers: list[tuple[Any, Any]] = field(default_factory=list)
    key: bytes | None = None
    attempt: str | None = None


@dataclass(slots=True)
class Aborted:
    """A request cancelled before it was admitted: an `abort` final without running it."""

    ticket: int
    request_id: str
    attempt: str
    batch_id: str | None
    submitted_at: float | None
    queued_at: float


# Commands on the publisher's queue: (kind, payload).
ADMIT = "admit"          # Admitted
OUTPUTS = "outputs"      # list[RequestOutput] of one engine step
ADD_FAILED = "add_failed"  # (attempt, message): the engine raised in add_request
REJECT = "reject"        # Rejected
ABORTED = "aborted"      # Aborted
HAND_BACK = "hand_back"  # attempt: publish nothing more for it (its partition moved)
STOP = "stop"            # None: flush, wait for acks (bounded), exit

# What the publisher reports back to the intake: (ticket, state).
FINISHED = "finished"    # the engine is done with it (its ending now waits for acks)
ACKED = "acked"          # every message of its ending acknowledged: its offsets are done
DROPPED = "dropped"      # handed back: it ended without publishing anything

# Commands on the engine loop's inbox.
ADD = "add"              # (attempt, add_request keyword arguments)
ABORT = "abort"          # attempt


class Slots:
    """A count of places that one thread takes and another gives back: the engine loop takes
    one per step it hands the publisher, the publisher gives it back once it has handled the
    step. Taking waits at most `timeout` seconds (never without bound)."""

    def __init__(self, size: int):
        self.size = size
        self.free = size
        self._cond = threading.Condition()

    def take(self, timeout: float) -> bool:
        with self._cond:
            if self.free <= 0 and not self._cond.wait_for(lambda: self.free > 0, timeout):
                return False
            self.free -= 1
            return True

    def give(self) -> None:
        with self._cond:
            self.free += 1
            self._cond.notify()

    @property
    def used(self) -> int:
        return self.size - self.free
