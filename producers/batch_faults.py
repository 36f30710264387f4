"""One batch's failure stays that batch's: the loops that serve every owner's batches (the
sweep, the enqueue task) hand an unexpected exception here instead of letting it end the
loop or leave the batch where it was forever.

    sweep / enqueue ── one batch raises ──► transient (database or broker away)?
                                              yes: logged; the next pass retries it
                                              no:  fail_batch: its open requests are ended
                                                   `cancelled`, the batch `failed` with the
                                                   reason in `errors`; the loop goes on
"""

from __future__ import annotations

import logging

from inflight.schemas.errors import BrokerError
from inflight.store import CANCELLED, FAILED
from inflight.store.queries import is_transient

from inflight.producers.batch_context import JobContext, end_requests, open_request_ids

log = logging.getLogger("inflight.batch")

ERR_BATCH_PROCESSING = "batch_processing_error"
MAX_REASON = 500


def transient(exc: BaseException) -> bool:
    """The database or the broker is away: the same work may succeed on the next pass."""
    return isinstance(exc, BrokerError) or is_transient(exc)


def reason_of(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text if len(text) <= MAX_REASON else text[:MAX_REASON - 3] + "..."


def fail_batch(ctx: JobContext, batch_id: str, exc: BaseException, stage: str) -> bool:
    """Mark the batch `failed` because `stage` raised `exc` (logged with its traceback);
    its requests not final yet are cancelled. True when this call moved it (False: it had
    already ended, or the store is away too). Never raises."""
    log.error("batch %s: %s failed (%s); the batch is marked failed, other batches go on",
              batch_id, stage, reason_of(exc), exc_info=exc)
    store = ctx.store
    try:
        for ids in open_request_ids(store, batch_id):
            end_requests(store, ids, batch_id, CANCELLED)
            ctx.publisher.cancel_many(ids)
    except Exception:  # noqa: BLE001 — the batch still gets its failed status below
        log.exception("batch %s: cancelling its open requests failed", batch_id)
    message = (f"the service could not {stage} this batch: {reason_of(exc)}. Its unfinished "
               "requests were cancelled; the server log has the details under the batch id")
    try:
        return store.transition_batch(batch_id, FAILED, errors=[
            {"code": ERR_BATCH_PROCESSING, "message": message, "param": None, "line": None}])
    except Exception:  # noqa: BLE001
        log.exception("batch %s: recording its failure failed", batch_id)
        return False
