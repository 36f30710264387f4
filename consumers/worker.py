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

Models (consumers/served_model.py): a worker serves one model, INFLIGHT_SERVED_MODEL_NAME
(default: the folder's name). It reads that model's request topics in that model's group
(the default model: today's names; which model that is, INFLIGHT_DEFAULT_MODEL, else the
first model whose workers the registry shows there), creates them at start when missing and allowed
(INFLIGHT_WORKER_CREATE_TOPICS), announces itself on the registry topic at start and every
INFLIGHT_REGISTRY_HEARTBEAT_S (transport/registry_writer.py), withdraws when it stops, and
ends a request for another model `model_not_found`. Its metrics carry `model_name`.

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
from inflight.consumers.served_model import Serving
from inflight.consumers.thread_messages import Settled
from inflight.schemas import Settings
from inflight.schemas.errors import BrokerError, ConfigError, InflightError
from inflight.transport.registry_reader import RegistryReader
from inflight.transport.registry_writer import RegistryAnnouncer
from inflight.transport.results_producer import ResultsProducer, results_producer
from inflight.transport.topics_admin import create_topics

if TYPE_CHECKING:
    from inflight.engine.config import EngineConfig
    from inflight.engine.tokenizer import Tokenizer

log = logging.getLogger("inflight.worker")

PUBLISHER_ACK_TIMEOUT_S = 10.0
REGISTRY_CHECK_S = 10.0  # at start: how long to read the registry for a clash (then go on)


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
        self.serving = Serving.of(settings, engine)
        model = self.serving.model
        self.metrics = metrics or Metrics("worker", settings.metrics_interval_s,
                                          labels={"model_name": model},
                                          tenant_label=settings.tenant_metrics)
        described = self.described = engine if isinstance(engine, DescribedEngine) else None
        self.engine_metrics = EngineMetrics(self.metrics.registry, model)
        settled: queue.SimpleQueue[Settled] = queue.SimpleQueue()
        self.publisher = EventPublisher(
            settings, None, settled, worker=self.name, metrics=self.metrics,
            engine_metrics=self.engine_metrics,
            logprobs=LogprobShaper(described.tokenizer) if described is not None else None,
            model=model)
        self.engine_loop = EngineLoop(engine, self.publisher.queue, self.publisher.steps,
                                      on_stats=self.engine_metrics.observe_stats)
        self.intake = Intake(settings, self.engine_loop, self.publisher.queue, settled,
                             attempt_prefix=self.generation,
                             # NOTE: read ahead of the engine's running set, so its scheduler
                             # sees every tenant's waiting work (fair share, deadlines), not
                             # only the head of the partitions (INFLIGHT_WORKER_READ_AHEAD)
                             max_inflight=self.max_inflight + settings.worker_read_ahead,
                             metrics=self.metrics, serving=self.serving,
                             engine_metrics=self.engine_metrics,
                             publisher_behind=lambda: self.publisher.behind,
                             template_takes_tools=described is not None
                             and described.tokenizer.takes_tools)
        self.lag: LagProbe | None = None
        self.announcer: RegistryAnnouncer | None = None
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
        self._resolve_topics()
        topics = self.serving.topics
        if s.worker_create_topics:
            self._create_topics()
        self.producer = results_producer(s)
        self.publisher.producer = self.producer
        self.intake.open()
        metrics = ""
        if s.metrics_port is not None:
            port = self.metrics.serve(s.metrics_port, s.metrics_host)
            metrics = f" metrics=http://{s.metrics_host}:{port}/metrics"
            self.lag = LagProbe(s, topics.group, [topics.requests, topics.batch],
                                self.metrics.registry, s.metrics_lag_interval_s,
                                model_name=self.serving.model).start()
        # NOTE: the run's generation in its registry id: two workers of one model in one
        # process (tests) must not withdraw each other
        self.announcer = RegistryAnnouncer(s, [self.serving.record(
            f"{self.name}/{self.generation}", s, time.time())])
        self.announcer.beat(force=True)
        config = self.described.config if self.described is not None else None
        serves = (f"{os.path.basename(str(config.model))} on {config.device} ({config.dtype})"
                  if config is not None else type(self.engine).__name__)
        log.info("worker %s serving %s as model %s%s: group=%s topics=%s,%s max_inflight=%d "
                 "attempts=%s.*%s", self.name, serves, self.serving.model,
                 " (the default)" if self.serving.default else "", topics.group,
                 topics.requests, topics.batch, self.max_inflight, self.generation, metrics)
        return self

    def _create_topics(self) -> None:
        """The shared topics and this model's request topics, where missing; a broker that
        refuses (not authorized) is logged: the topics must then exist already."""
        s = self.settings
        try:
            made = create_topics(s, partitions=s.topic_partitions, models=[self.serving.topics])
        except BrokerError as exc:
            log.warning("worker %s: could not create its topics (%s); `inflight topics create "
                        "--model %s` makes them", self.name, exc, self.serving.model)
            return
        created = sorted(t for t, state in made.items() if state == "created")
        if created:
            log.info("worker %s: created topics %s", self.name, ", ".join(created))

    def _resolve_topics(self) -> None:
        """Which topics to read, given the live registry. A worker that would read the
        default model's topics where live workers of another model read them already:
        with INFLIGHT_DEFAULT_MODEL unset (no model named the default), the first model
        there keeps them and this one reads its model's own (a warning says to name the
        default); with it set, the deployment disagrees with itself: ConfigError. A
        registry not read within REGISTRY_CHECK_S is logged, and the settings decide."""
        topics = self.serving.topics
        if not topics.default:
            return
        reader = RegistryReader(self.settings, name="worker-registry").start()
        try:
            if not reader.wait_ready(REGISTRY_CHECK_S):
                log.warning("worker %s: the model registry was not read within %.0fs (%s); "
                            "reading %s as the default model", self.name, REGISTRY_CHECK_S,
                            reader.error or "no answer", topics.requests)
                return
            there = sorted({r.model for r in reader.live()
                            if r.requests_topic == topics.requests and r.model != self.serving.model})
        finally:
            reader.close()
        if not there:
            return
        if self.settings.default_model is None:
            self.serving = self.serving.named(self.settings)
            self.intake.serve(self.serving)
            log.warning("worker %s: live workers of %s read the default model's topics (%s); "
                        "this worker of %r reads its model's own (%s). Set "
                        "INFLIGHT_DEFAULT_MODEL on every process to say which model is the "
                        "default", self.name, ", ".join(map(repr, there)), topics.requests,
                        self.serving.model, self.serving.topics.requests)
            return
        raise ConfigError(
            f"live workers of model(s) {', '.join(map(repr, there))} read {topics.requests}, "
            f"the default model's topic, but INFLIGHT_DEFAULT_MODEL here is "
            f"{self.settings.default_model!r}: every process of the deployment needs the same "
            "INFLIGHT_DEFAULT_MODEL (docs/service.md, many models)")

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
                self._beat()
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
        self._beat()

    def shutdown(self) -> None:
        """Graceful stop: drain (see Intake.drain), then stop the engine loop (handed-back
        requests end there), then the publisher (flush, wait for acks), polling all along;
        commit the final watermark. Leaving the group happens in close()."""
        s = self.settings
        self.withdraw()  # routers stop listing it now; what runs finishes
        self.intake.drain(s.worker_drain_timeout_s, stopped=lambda: self.failure is not None)
        self.engine_loop.stop()
        self._poll_while(lambda: not self.engine_loop.join(0), PUBLISHER_ACK_TIMEOUT_S)
        self.engine_loop.halt()  # a publisher stuck behind: what runs is redone elsewhere
        self.publisher.stop(PUBLISHER_ACK_TIMEOUT_S)
        self._poll_while(lambda: not self.publisher.join(0), PUBLISHER_ACK_TIMEOUT_S + 5)
        self.intake.run_once()  # the last settled tickets
        self.intake.commit()
        log.info("worker %s stopped; %s", self.name, self.metrics.summary())

    def _beat(self) -> None:
        if self.announcer is not None:
            adapters = sorted(self.serving.adapters)  # loaded / unloaded at run time
            records = self.announcer.records
            if records and records[0].adapters != adapters:
                records[0] = records[0].model_copy(update={"adapters": adapters})
                self.announcer.beat(force=True)
                return
            self.announcer.beat()

    def withdraw(self) -> None:
        """Take this worker off the registry (a tombstone); idempotent."""
        if self.announcer is not None:
            try:
                self.announcer.withdraw()
            except Exception:  # noqa: BLE001 - readers drop it after their TTL anyway
                log.exception("withdrawing from the registry failed")
            self.announcer = None

    def _poll_while(self, busy: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while busy() and time.monotonic() < deadline:
            self.intake.run_once()

    def close(self) -> None:
        self.withdraw()
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
