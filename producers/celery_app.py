"""The Celery app for batch jobs: broker choice, task names, beat schedule.

    app = celery_app(settings)           # the same configuration in senders and workers
    send_enqueue(app, batch_id)          # what Client.create_batch / the HTTP API call

The tasks themselves are registered by producers.batch_tasks (the worker side); senders
need only the names. Broker:

- `INFLIGHT_CELERY_BROKER=redis://host:6379/0` (production; docker-compose runs Redis);
- unset: kombu's filesystem transport (with atomic message files: producers.celery_fs)
  in `<INFLIGHT_DATA_DIR>/celery/` -- no server, for
  a laptop and `make demo` (one machine; a message taken by a worker that is then killed
  is not redelivered, which the sweep covers by sending the enqueue task again).

NOTE: no result backend (`task_ignore_result`): a batch's state lives in our `batches`
table. Messages are JSON only (never pickle across processes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from celery import Celery

from inflight.schemas import Settings

from inflight.producers.celery_fs import TRANSPORT as FS_TRANSPORT

ENQUEUE_TASK = "inflight.batch.enqueue"
SWEEP_TASK = "inflight.batch.sweep"
WEBHOOK_TASK = "inflight.batch.events"   # fan out batch events, deliver webhooks


def embedded_broker_dir(settings: Settings) -> Path:
    return Path(settings.data_dir) / "celery"


def broker_options(settings: Settings) -> tuple[str, str | None, dict[str, Any]]:
    """(broker URL, transport class or None for the URL's own, transport options)."""
    if settings.celery_broker:
        # a redelivered enqueue of a killed worker must wait out at most one lease
        return settings.celery_broker, None, {"visibility_timeout": max(settings.batch_lease_s * 2, 60)}
    root = embedded_broker_dir(settings)
    queue, processed, control = root / "queue", root / "processed", root / "control"
    for d in (queue, processed, control):
        d.mkdir(parents=True, exist_ok=True)
    # control_folder: kombu's default is ./control in the working directory. The host part
    # means nothing to this transport; without one kombu warns that it assumes localhost.
    return "filesystem://localhost/", FS_TRANSPORT, {
        "data_folder_in": str(queue), "data_folder_out": str(queue),
        "processed_folder": str(processed), "control_folder": str(control),
        "store_processed": False, "polling_interval": 0.2}


def celery_app(settings: Settings) -> Celery:
    """A configured Celery app (no tasks registered; see producers.batch_tasks)."""
    url, transport, options = broker_options(settings)
    app = Celery("inflight", broker=url, set_as_current=False)
    app.conf.update(
        broker_transport=transport,
        broker_transport_options=options,
        broker_connection_retry_on_startup=True,
        task_default_queue=settings.celery_queue,
        task_serializer="json", accept_content=["json"], result_serializer="json",
        task_ignore_result=True, result_backend=None,
        task_acks_late=True, task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False, worker_redirect_stdouts=False,
        worker_enable_remote_control=False,
        beat_schedule={"inflight-batch-sweep": {
            "task": SWEEP_TASK, "schedule": settings.batch_sweep_interval_s,
            # a sweep that could not start before the next one is due is dropped
            "options": {"expires": settings.batch_sweep_interval_s}},
            "inflight-batch-events": {
                "task": WEBHOOK_TASK, "schedule": settings.webhook_interval_s,
                "options": {"expires": max(settings.webhook_interval_s, 1.0)}}},
        beat_schedule_filename=str(Path(settings.data_dir) / "celery-beat-schedule"),
        timezone="UTC",
    )
    return app


def send_enqueue(app: Celery, batch_id: str) -> None:
    app.send_task(ENQUEUE_TASK, args=[batch_id])
