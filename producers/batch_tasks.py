"""The Celery worker side of batch jobs: tasks that call producers.batch_jobs.

    app = worker_app(settings, model_dir=..., model_name=...)
    run_worker(app, concurrency=2)       # blocks: a Celery worker with the sweep (beat) embedded

Tasks (names in producers.celery_app):

- `inflight.batch.enqueue(batch_id)`: validate_and_enqueue. acks_late: a worker lost
  mid-task has its message redelivered (Redis); a batch held by another task is retried
  later; an unreachable broker or database is retried with backoff (TRANSIENT_RETRIES
  times); any other exception marks that batch `failed` with the reason
  (producers.batch_faults).
- `inflight.batch.sweep()`: one sweep pass, every INFLIGHT_BATCH_SWEEP_INTERVAL_S (beat).
- `inflight.batch.events()`: batch events to the batch-events topic and to webhooks
  (producers.webhooks.deliver), every INFLIGHT_WEBHOOK_INTERVAL_S (beat).

Each process opens its own Store and Kafka producer on first use (after the fork of a
prefork pool) and keeps them.
"""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any

from celery import Celery

from inflight.schemas import Settings
from inflight.schemas.errors import NotFoundError, Retry
from inflight.store import Store
from inflight.store.urls import redact

from inflight.producers.batch_faults import fail_batch, reason_of, transient
from inflight.producers.batch_jobs import JobContext, sweep, validate_and_enqueue
from inflight.producers.batch_lines import context_length
from inflight.producers.celery_app import (ENQUEUE_TASK, SWEEP_TASK, WEBHOOK_TASK, celery_app,
                                           embedded_broker_dir, send_enqueue)
from inflight.producers.client import Client
from inflight.producers.webhooks import deliver

log = logging.getLogger("inflight.batch")

TRANSIENT_RETRIES = 20


class _Resources:
    """The per-process JobContext, built on first use (so after a prefork fork)."""

    def __init__(self, settings: Settings, model_dir: Path | None, model_name: str):
        self.settings = settings
        self.model_dir = model_dir
        self.model_name = model_name
        self._ctx: JobContext | None = None
        self._pid: int | None = None
        self._lock = threading.Lock()

    def ctx(self) -> JobContext:
        with self._lock:
            if self._ctx is None or self._pid != os.getpid():
                store = Store.embedded(self.settings.database_url,
                                       files_url=self.settings.files_url,
                                       files_endpoint=self.settings.files_s3_endpoint)
                context = context_length(self.settings, self.model_dir)
                # the client's models (the live registry) check and route each line's model
                client = Client(self.settings, store=store, default_context=context)
                self._ctx = JobContext(
                    store=store, publisher=client, settings=self.settings,
                    context_length=context, model_name=self.model_name,
                    worker=f"{socket.gethostname()}:{os.getpid()}",
                    models=client.models_client)
                self._pid = os.getpid()
            return self._ctx

    def close(self) -> None:
        with self._lock:
            if self._ctx is not None:
                self._ctx.publisher.close()  # type: ignore[attr-defined]
                self._ctx = None


def worker_app(settings: Settings, *, model_dir: Path | None = None,
               model_name: str | None = None) -> Celery:
    """The Celery app with the batch tasks registered (closures over this process's
    resources; no module-level app)."""
    app = celery_app(settings)
    name = model_name or (Path(settings.model_path).name if settings.model_path else "default")
    res = _Resources(settings, model_dir, name)
    app.inflight_resources = res  # type: ignore[attr-defined]

    @app.task(name=ENQUEUE_TASK, bind=True, max_retries=None, shared=False)
    def enqueue(self: Any, batch_id: str) -> str:
        try:
            outcome = validate_and_enqueue(res.ctx(), batch_id)
        except Retry as exc:
            raise self.retry(countdown=exc.delay, exc=exc) from exc
        except Exception as exc:  # noqa: BLE001 — one batch's failure is that batch's
            if isinstance(exc, NotFoundError) and res.ctx().store.get_batch(batch_id) is None:
                log.error("enqueue %s: %s", batch_id, exc)
                return "not found"
            # NOTE: any other NotFoundError is the batch's input file, deleted under it:
            # the batch fails saying so (it would wait in `validating` for its window)
            if transient(exc) and self.request.retries < TRANSIENT_RETRIES:
                delay = min(2 ** self.request.retries, 60)
                log.warning("enqueue %s: %s; retrying in %ss", batch_id, reason_of(exc), delay)
                raise self.retry(countdown=delay, exc=exc) from exc
            # a bug, a line that passed validation and still broke, or a broker/database
            # away for longer than the retries: the batch says so instead of hanging
            try:
                fail_batch(res.ctx(), batch_id, exc, "validate and enqueue")
            except Exception:  # noqa: BLE001 — no store to record it in: the log has it
                log.exception("enqueue %s: failed, and the failure could not be recorded",
                              batch_id)
            return "failed"
        log.info("enqueue %s: %s", batch_id, outcome)
        return outcome

    @app.task(name=SWEEP_TASK, shared=False)
    def sweep_task() -> dict[str, Any]:
        report = sweep(res.ctx(), dispatch_enqueue=lambda bid: send_enqueue(app, bid))
        if report.completed or report.expired or report.cancelled or report.redispatched:
            log.info("sweep: %s", report.to_json())
        return report.to_json()

    @app.task(name=WEBHOOK_TASK, shared=False)
    def events_task() -> dict[str, Any]:
        ctx = res.ctx()
        report = deliver(ctx.store, res.settings, publish=lambda bid, body: (
            ctx.publisher.publish_encoded([(bid, body)], topic=res.settings.topic_batch_events)))
        if report.fanned_out or report.published or report.delivered or report.given_up:
            log.info("batch events: %s", report.to_json())
        return report.to_json()

    return app


def make_worker(app: Celery, *, concurrency: int = 2, pool: str = "threads", beat: bool = True,
                hostname: str | None = None, loglevel: str = "INFO") -> Any:
    """A Celery WorkController for the batch tasks; `.start()` blocks until `.stop()` or a
    signal. With `beat`, the sweep schedule runs inside it (each worker its own beat: the
    sweep is safe to run twice at once)."""
    from celery.platforms import SecurityWarning

    # NOTE: Celery warns in six lines when its worker runs as root (CI containers, a
    # laptop's `make demo`) of what pickle would allow; these workers take JSON only
    # (producers.celery_app). `inflight jobs` says so in its start line instead.
    warnings.filterwarnings("ignore", category=SecurityWarning)
    schedule = Path(tempfile.mkdtemp(prefix="inflight-beat-")) / "schedule"
    return app.Worker(concurrency=concurrency, pool=pool, beat=beat, loglevel=loglevel,
                      hostname=hostname or f"inflight-jobs-{os.getpid()}@{socket.gethostname()}",
                      schedule_filename=str(schedule), without_mingle=True,
                      without_gossip=True, without_heartbeat=True, quiet=True)


def run_worker(app: Celery, **kw: Any) -> None:
    """`inflight jobs`: run a worker (make_worker's arguments) until SIGTERM / Ctrl-C. Once
    it takes tasks, one line says what it serves (instead of Celery's own start-up lines)."""
    from celery.signals import worker_ready

    for name in ("celery.apps.worker", "celery.beat", "celery.worker.consumer.connection"):
        logging.getLogger(name).setLevel(logging.WARNING)
    s: Settings = app.inflight_resources.settings  # type: ignore[attr-defined]
    broker = (f"embedded filesystem transport in {embedded_broker_dir(s)}" if not s.celery_broker
              else redact(s.celery_broker))
    root = hasattr(os, "geteuid") and os.geteuid() == 0

    def ready(**_: Any) -> None:
        log.info("jobs ready: batch tasks of queue %s from %s; store %s; %s x %s%s%s",
                 s.celery_queue, broker, redact(s.database_url), kw.get("concurrency", 2),
                 kw.get("pool", "threads"),
                 f"; sweep every {s.batch_sweep_interval_s:g}s" if kw.get("beat", True) else "",
                 " (as root: it takes JSON messages only, never pickle)" if root else "")

    worker_ready.connect(ready, weak=False)
    try:
        make_worker(app, **kw).start()
    finally:
        worker_ready.disconnect(ready)
        app.inflight_resources.close()  # type: ignore[attr-defined]
