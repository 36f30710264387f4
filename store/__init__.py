"""The SQL store: tables, idempotent upserts and lookups. Imports only `schemas`."""

from store.migrate import upgrade
from store.models import (CANCELLED, COMPLETED, EXPIRED, FAILED, FINAL_STATUSES, QUEUED, RUNNING,
                          STATUS_RANK, STATUSES, BatchRow, RequestRow)
from store.queries import Store, normalize_url
from store.rows import (FINISH_TO_STATUS, error_row, final_row, queued_row, running_row,
                        stand_in_rows)

__all__ = ["Store", "upgrade", "normalize_url", "RequestRow", "BatchRow", "STATUSES",
           "FINAL_STATUSES", "STATUS_RANK", "QUEUED", "RUNNING", "COMPLETED", "FAILED",
           "CANCELLED", "EXPIRED", "FINISH_TO_STATUS", "queued_row", "running_row", "final_row",
           "error_row", "stand_in_rows"]
