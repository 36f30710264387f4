"""What the batch-job functions share: the context they run in, the publisher they need,
and the small store operations both the enqueue and the sweep use."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from inflight.producers.models_client import ModelsClient
from inflight.schemas import Settings
from inflight.store import CANCELLED, EXPIRED, QUEUED, RUNNING, BatchRow, Store
from inflight.store.models import utcnow

ERR_BATCH_EXPIRED = "batch_expired"


class RequestPublisher(Protocol):
    """How batch jobs publish encoded requests and cancels (producers.Client is one)."""

    def publish_encoded(self, items: Iterable[tuple[str, bytes]], *, topic: str) -> int: ...
    def cancel_many(self, request_ids: Iterable[str]) -> int: ...
    def cancel_batch_requests(self, batch_id: str) -> None: ...


@dataclass
class JobContext:
    """What the batch functions need; one per process (the Celery worker builds it)."""

    store: Store
    publisher: RequestPublisher
    settings: Settings
    context_length: int | None = None   # producers.batch_lines.context_length
    model_name: str = "default"         # `model` in result bodies when a line names none
    worker: str = field(default_factory=lambda: f"pid{uuid.uuid4().hex[:6]}")
    # the live registry, for each line's model (None: one of its own, reading the registry
    # from the first line that names a model; the default model needs none)
    models: ModelsClient | None = None

    def __post_init__(self) -> None:
        if self.models is None:
            self.models = ModelsClient(self.settings, default_context=self.context_length)

    def close(self) -> None:
        if self.models is not None:
            self.models.close()


def expired(b: BatchRow) -> bool:
    """The batch's completion window is over."""
    return b.expires_at is not None and utcnow() >= b.expires_at


_END_MESSAGES = {CANCELLED: ("cancelled", "the batch was cancelled before this request ran"),
                 EXPIRED: (ERR_BATCH_EXPIRED, "the batch's completion window ended before "
                           "this request finished")}


def end_requests(store: Store, ids: list[str], batch_id: str, status: str) -> None:
    """Give requests a final `cancelled`/`expired` row (forward-only: a request that already
    ended keeps its row)."""
    code, message = _END_MESSAGES[status]
    now = utcnow()
    store.upsert_requests({"id": rid, "batch_id": batch_id, "status": status,
                           "finish_reason": "abort", "error": message, "error_code": code,
                           "finished_at": now} for rid in ids)


def open_request_ids(store: Store, batch_id: str) -> Iterable[list[str]]:
    """Pages of the batch's request ids that are not final yet."""
    after = None
    while True:
        rows = store.list_batch(batch_id, status=[QUEUED, RUNNING], after=after, limit=1000)
        if not rows:
            return
        yield [r.id for r in rows]
        after = rows[-1].id


def dispatch_marker(batch_id: str) -> str:
    """The lease owner the sweep sets when it sends a batch's enqueue task again; that task
    may take the lease over from it."""
    return f"dispatch:{batch_id}"
