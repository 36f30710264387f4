"""Reclaim uploads a crash interrupted: files still `uploading` past the grace period.

An upload streams into the store chunk by chunk (store.files) and marks its file
`uploaded` at the end; a process killed in between (kill -9, an OOM kill) leaves the row
`uploading` with the chunks written so far, which no reader sees and nobody could delete.
Every API process sweeps them (store.Store.reclaim_uploads), and deletes files past their
expires_at (store.Store.delete_expired_files), at start and then every half
grace period (at most every minute): a restarted API cleans up after the one that died.
"""

from __future__ import annotations

import asyncio
import logging

from anyio import to_thread

from inflight.store import Store

log = logging.getLogger("inflight.api")

MAX_PERIOD_S = 60.0


def sweep_period(grace_s: float) -> float:
    return min(grace_s / 2, MAX_PERIOD_S)


async def sweep_uploads(store: Store, grace_s: float) -> None:
    """Run until cancelled; a failed pass (the database away) is logged and retried."""
    while True:
        try:
            gone = await to_thread.run_sync(store.reclaim_uploads, grace_s)
            if gone:
                log.info("api: reclaimed %d upload(s) left unfinished for over %gs: %s",
                         len(gone), grace_s, ", ".join(gone))
            expired = await to_thread.run_sync(store.delete_expired_files)
            if expired:
                log.info("api: deleted %d expired file(s): %s", len(expired),
                         ", ".join(expired[:20]))
        except Exception as exc:  # noqa: BLE001 - the sweep outlives a database outage
            log.warning("api: the sweep of abandoned uploads failed (%s); next try in %gs",
                        str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                        sweep_period(grace_s))
        await asyncio.sleep(sweep_period(grace_s))
