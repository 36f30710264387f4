"""The engine thread: it only steps the engine.

    inbox (AddRequest / AbortRequest, from the intake) ─► engine.add_request / abort
    engine.step() ─► the publisher's queue: StepOutputs (the step's RequestOutputs, as they
                     are, and when the step returned), one of the publisher's step slots each;
                     AddFailed when add_request refused a request
    Engine.stats() every STATS_EVERY_S ─► the engine metrics' gauges

No Kafka and no JSON happen on this thread. It launches the engine's device work, so it
makes the engine's device its current device first (`engine.bind_thread()`): CUDA's
current device is per thread, and a worker on cuda:1 must not launch on device 0. The
inbox is bounded by the intake's in-flight limit (it admits at most that many requests);
the publisher takes a bounded number of steps (consumers.thread_messages.Slots), so a
publisher that falls behind slows the engine instead of filling memory. The engine then
waits for a slot in slices of PUBLISH_WAIT_S, never without bound: between them it applies
its inbox (aborts, adds) and sees halt(); the intake meanwhile admits nothing new and goes
on polling (consumers.publisher).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from inflight.consumers.thread_messages import (AbortRequest, AddFailed, AddRequest, LoraControl,
                                                EngineCommand, PublisherCommand, Slots,
                                                StepOutputs)
from inflight.schemas.errors import InflightError

if TYPE_CHECKING:
    from inflight.engine.outputs import RequestOutput
    from inflight.engine.sampling_params import SamplingParams

log = logging.getLogger("inflight.worker")

IDLE_WAIT_S = 0.05  # an idle engine waits this long on its inbox before looking again
STATS_EVERY_S = 0.05  # Engine.stats() (the engine is not thread-safe: read here) -> metrics
PUBLISH_WAIT_S = 0.1  # the publisher's step slots all taken: look again this often


class EngineLike(Protocol):
    """What the worker asks of an engine (inflight.engine.Engine; tests and benchmarks
    drive the worker with fakes that have only these four calls)."""

    def add_request(self, request_id: str, prompt: str | None = None,
                    prompt_token_ids: list[int] | None = None,
                    params: SamplingParams | None = None, priority: int = 0,
                    **kw: Any) -> None: ...
    def step(self) -> list[RequestOutput]: ...
    def abort(self, request_id: str) -> bool: ...
    def has_unfinished(self) -> bool: ...


@runtime_checkable
class BindsThread(Protocol):
    """An engine on a device: the thread that launches its work makes that device current."""

    def bind_thread(self) -> None: ...


@runtime_checkable
class ReportsStats(Protocol):
    """An engine whose Engine.stats() feeds the engine metrics' gauges."""

    def stats(self) -> dict: ...


class EngineLoop:
    def __init__(self, engine: EngineLike, publish: queue.SimpleQueue[PublisherCommand],
                 slots: Slots, on_stats: Callable[[dict], None] | None = None):
        self.engine = engine
        self.on_stats = on_stats if isinstance(engine, ReportsStats) else None
        self.inbox: queue.SimpleQueue[EngineCommand | None] = queue.SimpleQueue()
        self._publish = publish
        self._slots = slots
        self._stop = threading.Event()
        self._halt = threading.Event()
        self.steps = 0
        self.publish_waits = 0    # slices spent waiting for a publisher that fell behind
        self.cpu_s = 0.0          # CPU seconds of this thread so far (the engine's own cost)
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None

    # -- called from other threads ----------------------------------------------------------
    def add(self, attempt: str, *, prompt: str | None = None,
            prompt_token_ids: list[int] | None = None, params: SamplingParams | None = None,
            priority: int = 0, messages: list[dict[str, Any]] | None = None,
            arrival_time: float | None = None,
            tools: list[dict[str, Any]] | None = None, dimensions: int | None = None,
            lora: str | None = None, tenant: str | None = None,
            deadline: float | None = None) -> None:
        """engine.add_request(attempt, ...) on the engine's thread (AddFailed to the
        publisher if the engine refuses it)."""
        self.inbox.put(AddRequest(attempt, prompt, prompt_token_ids, params, priority,
                                  messages, arrival_time, tools, dimensions, lora, tenant,
                                  deadline))

    def abort(self, attempt: str) -> None:
        self.inbox.put(AbortRequest(attempt))

    def lora(self, command: Any, adapters: set[str]) -> None:
        """Load / unload a LoRA adapter on the engine's thread (see LoraControl)."""
        self.inbox.put(LoraControl(command, adapters))

    def start(self) -> "EngineLoop":
        self.thread = threading.Thread(target=self.run, name="engine", daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        """Finish what the engine holds (aborted requests end at their next step), then exit."""
        self._stop.set()
        self.inbox.put(None)

    def halt(self) -> None:
        """Exit now, without finishing (shutdown gave up waiting on the publisher): what
        runs is redone by the group, its offsets being uncommitted."""
        self._halt.set()
        self.stop()

    def join(self, timeout: float | None = None) -> bool:
        if self.thread is not None:
            self.thread.join(timeout)
            return not self.thread.is_alive()
        return True

    # -- the thread -----------------------------------------------------------------------
    def run(self) -> None:
        engine, inbox, publish = self.engine, self.inbox, self._publish
        cpu0 = time.thread_time()
        next_stats = 0.0
        try:
            if isinstance(engine, BindsThread):  # test fakes have no device
                engine.bind_thread()
            while True:
                if self.on_stats is not None and time.monotonic() >= next_stats:
                    next_stats = time.monotonic() + STATS_EVERY_S
                    self.on_stats(engine.stats())
                busy = engine.has_unfinished()
                if (not busy and self._stop.is_set()) or self._halt.is_set():
                    return
                # NOTE: a busy engine never waits for commands; an idle one sleeps on its inbox.
                try:
                    cmd = inbox.get_nowait() if busy else inbox.get(timeout=IDLE_WAIT_S)
                except queue.Empty:
                    cmd = None
                if cmd is not None:
                    self._apply(cmd)
                    self._apply_inbox()
                if engine.has_unfinished():
                    outputs = engine.step()
                    self.steps += 1
                    self.cpu_s = time.thread_time() - cpu0
                    if outputs and self._wait_for_slot():
                        publish.put(StepOutputs(outputs, time.time()))
        except BaseException as exc:  # noqa: BLE001 - reported to the worker, which stops
            log.exception("the engine loop failed; the worker stops")
            self.error = exc
        finally:
            self.cpu_s = time.thread_time() - cpu0

    def _apply_inbox(self) -> None:
        inbox = self.inbox
        while True:
            try:
                cmd = inbox.get_nowait()
            except queue.Empty:
                return
            if cmd is not None:
                self._apply(cmd)

    def _wait_for_slot(self) -> bool:
        """A step slot of the publisher, waiting in bounded slices while the publisher is
        behind; False when halted meanwhile (the step's outputs are dropped)."""
        while not self._slots.take(PUBLISH_WAIT_S):
            self.publish_waits += 1
            if self._halt.is_set():
                return False
            self._apply_inbox()
        return True

    def _apply_lora(self, cmd: LoraControl) -> None:
        c = cmd.command
        try:
            if c.action == "load":
                if c.lora_name in cmd.adapters:
                    log.info("LoRA adapter %r is loaded already: load ignored", c.lora_name)
                    return
                self.engine.add_lora(c.lora_name, c.lora_path)
                cmd.adapters.add(c.lora_name)
            else:
                if c.lora_name not in cmd.adapters:
                    return
                self.engine.remove_lora(c.lora_name)
                cmd.adapters.discard(c.lora_name)
            log.info("LoRA adapter %r %sed", c.lora_name, c.action)
        except (InflightError, AttributeError) as exc:
            log.warning("LoRA %s of %r failed: %s", c.action, c.lora_name, exc)

    def _apply(self, cmd: EngineCommand) -> None:
        if type(cmd) is AbortRequest:
            self.engine.abort(cmd.attempt)
            return
        if type(cmd) is LoraControl:
            self._apply_lora(cmd)
            return
        # NOTE: `tools` only when given: an engine (or a fake) whose template takes none
        # is never handed the keyword
        extra = {} if cmd.tools is None else {"tools": cmd.tools}
        if cmd.tenant is not None:
            extra["tenant"] = cmd.tenant
        if cmd.deadline is not None:
            extra["deadline"] = cmd.deadline
        if cmd.dimensions is not None:  # an embedding request's (EmbeddingEngine)
            extra["dimensions"] = cmd.dimensions
        if cmd.lora is not None:
            extra["lora"] = cmd.lora
        try:
            self.engine.add_request(cmd.attempt, prompt=cmd.prompt,
                                    prompt_token_ids=cmd.prompt_token_ids, params=cmd.params,
                                    priority=cmd.priority, messages=cmd.messages,
                                    arrival_time=cmd.arrival_time, **extra)
        except InflightError as exc:
            self._publish.put(AddFailed(cmd.attempt, str(exc)))
