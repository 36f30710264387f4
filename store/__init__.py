"""The SQL store: tables, idempotent upserts and lookups. Imports only `schemas`.

`upgrade` (Alembic) loads on first use: a pipeline that only polls results never imports
Alembic.
"""

from typing import Any

from inflight.store.files import CHUNK_BYTES, FILE_PURPOSES, new_file_id
from inflight.store.models import (BATCH_FINAL_STATUSES, BATCH_PREDECESSORS, BATCH_STATUSES, CANCELLED,
                          CANCELLING, COMPLETED, EXPIRED, FAILED, FINAL_STATUSES, FINALIZING,
                          IN_PROGRESS, QUEUED, RUNNING, STATUS_RANK, STATUSES, VALIDATING,
                          BatchRow, FileRow, RequestRow)
from inflight.store.queries import Store, normalize_url
from inflight.store.keys import ApiKeyRow  # registers api_keys on Base.metadata (migrations compare it)
from inflight.store import webhook_models  # noqa: F401  (the same for the webhook tables)
from inflight.store.rows import (FINISH_TO_STATUS, error_row, final_row, queued_row, running_row,
                        stand_in_rows)

__all__ = ["Store", "upgrade", "normalize_url", "RequestRow", "BatchRow", "FileRow", "ApiKeyRow", "STATUSES",
           "BATCH_STATUSES", "BATCH_FINAL_STATUSES", "BATCH_PREDECESSORS", "VALIDATING",
           "IN_PROGRESS", "FINALIZING", "CANCELLING", "CHUNK_BYTES", "FILE_PURPOSES",
           "new_file_id",
           "FINAL_STATUSES", "STATUS_RANK", "QUEUED", "RUNNING", "COMPLETED", "FAILED",
           "CANCELLED", "EXPIRED", "FINISH_TO_STATUS", "queued_row", "running_row", "final_row",
           "error_row", "stand_in_rows"]


def __getattr__(name: str) -> Any:
    if name == "upgrade":
        from inflight.store.migrate import upgrade

        return upgrade
    raise AttributeError(f"module 'inflight.store' has no attribute {name!r}")
