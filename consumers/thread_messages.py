"""What the worker's three threads hand each other (see consumers/worker.py for the picture):
one small frozen dataclass per kind of message, dispatched by its type.

    intake ──Admitted/Rejected/Aborted/HandBack──► publisher ◄──StepOutputs/AddFailed── engine loop
       │                                              │                                    ▲
       └────────────────AddRequest/AbortRequest───────┼────────────────────────────────────┘
       ▲                                              │
       ├──────────── Settled(ticket, state) ──────────┘  (finished in the engine; acked; dropped)
       └── PartitionsRevoked/PartitionsAssigned ── the group consumer's rebalance listener
                                                   (kafka-python's I/O thread)

Every message is built by one thread and only read after it is handed over: no locks (but
in Slots, which two threads share).

A *ticket* numbers one unit of work whose ending settles offsets: an admitted request, or
a rejected message. An *attempt* names one admission of a request on the wire and in the
engine (the engine's request id), so a request redone after a rebalance never collides
with an earlier, aborting copy of itself.
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kafka import TopicPartition

    from inflight.engine.outputs import RequestOutput
    from inflight.engine.sampling_params import SamplingParams

# A record's headers as kafka-python hands them over (keys escaped if not UTF-8, values
# None where the producer sent a null).
Headers = list[tuple[str, bytes | None]]


# -- intake -> publisher ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
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
    headers: Headers = field(default_factory=list)  # engine refuse its input
    key: bytes | None = None
    tools: bool = False                      # read tool calls out of the answer
    tenant: str | None = None                # the request's tenant (its events' header)
    reply_to: str | None = None              # a topic that gets its final (and deltas) too
    model: str | None = None                 # a LoRA adapter's name: its events carry it


@dataclass(frozen=True, slots=True)
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
    headers: Headers = field(default_factory=list)
    key: bytes | None = None
    attempt: str | None = None
    model: str | None = None                 # the model the request named (model_not_found)
    tenant: str | None = None
    reply_to: str | None = None              # an allowed reply topic: the error goes there too


@dataclass(frozen=True, slots=True)
class Aborted:
    """A request cancelled before it was admitted: an `abort` final without running it
    (finish_reason "expired": its deadline passed before it was read)."""

    ticket: int
    request_id: str
    attempt: str
    batch_id: str | None
    submitted_at: float | None
    queued_at: float
    headers: Headers = field(default_factory=list)
    tenant: str | None = None
    reply_to: str | None = None
    finish_reason: str = "abort"
    model: str | None = None                 # a LoRA adapter's name: its final carries it


@dataclass(frozen=True, slots=True)
class HandBack:
    """Publish nothing more for this attempt: its partition moved to another worker."""

    attempt: str


# -- engine loop -> publisher ------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StepOutputs:
    """One engine step's outputs, as the engine returned them, and when it returned
    (time.time())."""

    outputs: list[RequestOutput]
    at: float


@dataclass(frozen=True, slots=True)
class AddFailed:
    """engine.add_request refused the attempt (InflightError): it ends with an error final."""

    attempt: str
    message: str


# -- worker -> publisher -----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StopPublishing:
    """Flush, wait up to `ack_timeout` seconds for outstanding acknowledgements, exit."""

    ack_timeout: float


PublisherCommand = (Admitted | Rejected | Aborted | HandBack | StepOutputs | AddFailed
                    | StopPublishing)


# -- publisher -> intake -----------------------------------------------------------------------
class TicketState(enum.Enum):
    FINISHED = "finished"  # the engine is done with it (its ending now waits for acks)
    ACKED = "acked"        # every message of its ending acknowledged: its offsets are done
    DROPPED = "dropped"    # handed back: it ended without publishing anything


@dataclass(frozen=True, slots=True)
class Settled:
    ticket: int
    state: TicketState


# -- intake -> engine loop ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class AddRequest:
    """engine.add_request(attempt, ...) on the engine's thread. `tools`: the tool
    definitions, for a chat template that renders them (absent otherwise)."""

    attempt: str
    prompt: str | None = None
    prompt_token_ids: list[int] | None = None
    params: SamplingParams | None = None     # None: the engine's defaults
    priority: int = 0
    messages: list[dict[str, Any]] | None = None
    arrival_time: float | None = None
    tools: list[dict[str, Any]] | None = None
    dimensions: int | None = None  # an embedding request's cut (EmbeddingEngine)
    lora: str | None = None                  # the LoRA adapter the request names (engine/lora)
    tenant: str | None = None                # (absent unless set, as tools)
    deadline: float | None = None


@dataclass(frozen=True, slots=True)
class AbortRequest:
    attempt: str


@dataclass(frozen=True, slots=True)
class LoraControl:
    """Load or unload a LoRA adapter on the engine's thread (schemas/lora.py); on success
    `adapters` (the worker's Serving.adapters: what it routes and announces) follows."""

    command: Any            # schemas.lora.LoraCommand
    adapters: set[str]


EngineCommand = AddRequest | AbortRequest | LoraControl


# -- the rebalance listener (kafka-python's I/O thread) -> intake ------------------------------
@dataclass(frozen=True, slots=True)
class PartitionsRevoked:
    partitions: set[TopicPartition]


@dataclass(frozen=True, slots=True)
class PartitionsAssigned:
    partitions: set[TopicPartition]


Rebalance = PartitionsRevoked | PartitionsAssigned


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
