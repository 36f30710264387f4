"""The GPU worker: Kafka requests in, `engine.Engine` steps, token deltas and finals out.

Three threads, so the engine never waits on Kafka or JSON:

    intake (this thread)          engine loop                publisher
    ───────────────────────       ──────────────────         ──────────────────────────
    poll, validate, admit  ─Add─► add_request / abort        status, coalesced deltas,
    pause/resume, cancels         step() ──outputs──────────► finals, errors + DLQ copies
    rebalances, hand-backs ─Admitted / Rejected────────────► sends; acks
    watermark commits  ◄───────────────── settled tickets ──┘

(consumers/intake.py, engine_loop.py, publisher.py; what they hand each other, one small
frozen dataclass per kind of message: consumers/thread_messages.py.) The in-flight limit bounds the intake's admissions and so the
engine's inbox; the publisher takes a bounded number of engine steps, so a slow broker
slows the engine instead of filling memory, and stops admission while the intake goes on
polling (no thread waits on the broker without a short bound: the worker stays in its
group through a stalled broker).

Delivery (DESIGN.md): a partition's offset is committed only below every request whose
final event Kafka has acknowledged (consumers.offsets), rebalances included. Bad input gets
a final ErrorEvent, its raw bytes and headers go to the DLQ, and the offset moves on.
Idempotency: a request id in flight, or finished recently, is not run again. Every event
carries the attempt (this worker's generation + a ticket number). SIGTERM drains: nothing
new is admitted, partitions stay paused but polled (rebalances go on), what runs finishes
within INFLIGHT_WORKER_DRAIN_TIMEOUT_S or is handed back uncommitted. The worker never
talks to the database.

Run it: `inflight worker` (settings from INFLIGHT_*, its flags over them; the engine's
config from consumers.engine_bridge.engine_config).
"""

from __future__ import annotations

import gc
import logging
import os
import queue
import signal
import socket
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from inflight.consumers.engine_bridge import LogprobShaper
from inflight.consumers.engine_loop import EngineLike, EngineLoop
from inflight.consumers.engine_metrics import EngineMetrics
from inflight.consumers.intake import Intake
from inflight.consumers.lag import LagProbe
from inflight.consumers.metrics import Metrics
from inflight.consumers.publisher import EventPublisher
from inflight.consumers.thread_messages import Settled
from inflight.schemas import Settings
from inflight.schemas.errors import InflightError
from inflight.transport.results_producer import ResultsProducer, results_producer

if TYPE_CHECKING:
    from inflight.engine.config import EngineConfig
    from inflight.engine.tokenizer import Tokenizer

log = logging.getLogger("inflight.worker")

PUBLISHER_ACK_TIMEOUT_S = 10.0


@runtime_checkable
class DescribedEngine(Protocol):
    """An engine that says what it serves (inflight.engine.Engine; the fakes of tests and
    benchmarks do not): its model folder names the engine metrics, its tokenizer shapes
    logprobs and says whether the chat template renders tool definitions."""

    config: EngineConfig
    tokenizer: Tokenizer


@runtime_checkable
class ClosableEngine(Protocol):
    """An engine with resources of its own to release (tensor-parallel ranks)."""

    def close(self) -> None: ...


class Worker:
    def __init__(self, settings: Settings, engine: EngineLike, *, name: str | None = None,
                 max_inflight: int | None = None, metrics: Metrics | None = None):
        self.settings = settings
        self.engine = engine
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        # NOTE: attempt ids must differ between two runs of one request, also across
        # restarts of a worker with the same name (a container's pid is always 1).
        self.generation = uuid.uuid4().hex[:8]
        self.max_inflight = max_inflight or settings.worker_max_inflight
        self.metrics = metrics or Metrics("worker", settings.metrics_interval_s)
        described = self.described = engine if isinstance(engine, DescribedEngine) else None
        model = described.config.model if described is not None else None
        self.engine_metrics = EngineMetrics(self.metrics.registry,
                                            os.path.basename(str(model)) if model else "unknown")
        settled: queue.SimpleQueue[Settled] = queue.SimpleQueue()
        self.publisher = EventPublisher(
            settings, None, settled, worker=self.name, metrics=self.metrics,
            engine_metrics=self.engine_metrics,
            logprobs=LogprobShaper(described.tokenizer) if described is not None else None)
        self.engine_loop = EngineLoop(engine, self.publisher.queue, self.publisher.steps,
                                      on_stats=self.engine_metrics.observe_stats)
        self.intake = Intake(settings, self.engine_loop, self.publisher.queue, settled,
                             attempt_prefix=self.generation, max_inflight=self.max_inflight,
                             metrics=self.metrics, engine_metrics=self.engine_metrics,
                             publisher_behind=lambda: self.publisher.behind,
                             template_takes_tools=described is not None
                             and described.tokenizer.takes_tools)
        self.lag: LagProbe | None = None
        self.producer: ResultsProducer | None = None
        self._stopping = False
        self._threads_started = False

    # -- lifecycle ------------------------------------------------------------------------
    def stop(self, *_: Any) -> None:
        """Ask the worker to stop (signal-safe): drain, commit, leave the group."""
        self._stopping = True

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)

    def open(self) -> "Worker":
        s = self.settings
        self.producer = results_producer(s)
        self.publisher.producer = self.producer
        self.intake.open()
        metrics = ""
        if s.metrics_port is not None:
            port = self.metrics.serve(s.metrics_port, s.metrics_host)
            metrics = f" metrics=http://{s.metrics_host}:{port}/metrics"
            self.lag = LagProbe(s, s.worker_group, [s.topic_requests, s.topic_requests_batch],
                                self.metrics.registry, s.metrics_lag_interval_s).start()
        config = self.described.config if self.described is not None else None
        serves = (f"{os.path.basename(str(config.model))} on {config.device} ({config.dtype})"
                  if config is not None else type(self.engine).__name__)
        log.info("worker %s serving %s: group=%s topics=%s,%s max_inflight=%d attempts=%s.*%s",
                 self.name, serves, s.worker_group, s.topic_requests, s.topic_requests_batch,
                 self.max_inflight, self.generation, metrics)
        return self

    def start(self) -> "Worker":
        """Start the engine and publisher threads (the intake runs in the caller's)."""
        if self.producer is None:
            self.open()
        if not self._threads_started:
            self._threads_started = True
            self.engine_loop.start()
            self.publisher.start()
        return self

    @property
    def failure(self) -> BaseException | None:
        return self.engine_loop.error or self.publisher.error

    def run(self) -> None:
        self.start()
        try:
            while not self._stopping and self.failure is None:
                self.intake.run_once()
            self.shutdown()
        finally:
            self.close()
        if self.failure is not None:
            raise InflightError(f"worker {self.name} stopped: {self.failure!r}") from self.failure

    def run_once(self) -> None:
        """One intake round (tests and benchmarks drive the worker by hand with this)."""
        self.start()
        if self.failure is not None:
            raise InflightError(f"worker {self.name} failed: {self.failure!r}") from self.failure
        self.intake.run_once()

    def shutdown(self) -> None:
        """Graceful stop: drain (see Intake.drain), then stop the engine loop (handed-back
        requests end there), then the publisher (flush, wait for acks), polling all along;
        commit the final watermark. Leaving the group happens in close()."""
        s = self.settings
        self.intake.drain(s.worker_drain_timeout_s, stopped=lambda: self.failure is not None)
        self.engine_loop.stop()
        self._poll_while(lambda: not self.engine_loop.join(0), PUBLISHER_ACK_TIMEOUT_S)
        self.engine_loop.halt()  # a publisher stuck behind: what runs is redone elsewhere
        self.publisher.stop(PUBLISHER_ACK_TIMEOUT_S)
        self._poll_while(lambda: not self.publisher.join(0), PUBLISHER_ACK_TIMEOUT_S + 5)
        self.intake.run_once()  # the last settled tickets
        self.intake.commit()
        log.info("worker %s stopped; %s", self.name, self.metrics.summary())

    def _poll_while(self, busy: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while busy() and time.monotonic() < deadline:
            self.intake.run_once()

    def close(self) -> None:
        if self.lag is not None:
            try:
                self.lag.close()
            except Exception:  # noqa: BLE001 - closing must not mask the real error
                log.exception("closing the lag probe failed")
            self.lag = None
        self.intake.close()
        if self.producer is not None:
            try:
                self.producer.close(timeout=5)
            except Exception:  # noqa: BLE001 - closing must not mask the real error
                log.exception("closing the producer failed")
            self.producer = None
        self.metrics.close()

    # -- state, for tests and benchmarks ----------------------------------------------------
    @property
    def in_flight(self) -> int:
        return self.intake.in_flight

    @property
    def max_seen_inflight(self) -> int:
        return self.intake.max_seen_inflight


def run_worker(settings: Settings, engine: EngineLike) -> int:
    """Serve `engine` as one worker until SIGTERM or SIGINT (then drain, commit, leave the
    group); the heap is settled once start-up is done. `inflight worker` runs it."""
    worker = Worker(settings, engine)
    worker.install_signal_handlers()
    settle_heap()
    try:
        worker.run()
    finally:
        if isinstance(engine, ClosableEngine):  # its tensor-parallel ranks, if any
            engine.close()
    return 0


def settle_heap() -> None:
    """Once start-up is done (the engine built, torch and the model loaded): collect, then
    move every object alive now out of the garbage collector's reach (`gc.freeze()`, as
    vLLM does after its start-up).

    NOTE (why): the worker allocates a few objects per token (the engine's outputs, token
    lists), so the collector runs every few engine steps, and each full collection walked
    the whole start-up heap (torch's modules, the model): about half of the worker's
    collector time in the synthetic benchmark, on the threads that share the GIL with the
    engine's. Only for a process's entry point: in a long-lived process (tests) objects
    frozen now are never collected. The youngest generation is collected every 50,000
    allocations instead of 700 (a few steps' worth, not one step's): the service's
    per-token objects form no cycles, so collecting them more often frees nothing."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, *gc.get_threshold()[1:])
