"""Grouped reads for polls: concurrent lookups of requests by id share one SELECT.

A poll of an unfinished request is a primary-key read. Done one by one, each costs a hop
to a database thread and a round trip whose driver overhead (psycopg + SQLAlchemy, and
the thread hop under load) is several times the database's own work. Here a lookup joins
the pending group and one reader at a time fetches
the whole group with `WHERE id IN (...)` (store.owner_queries.request_views), like the submits'
group commit (api/group_commit.py): a lone poll is read at once, and under load the group
grows with the load instead of the queue of threads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from inflight.api.metrics import ApiMetrics
from inflight.store import Store
from inflight.store.owner_queries import request_views

MAX_GROUP = 500


class ViewQueue:
    def __init__(self, store: Store, run: Callable[..., Awaitable[Any]], metrics: ApiMetrics):
        self.store = store
        self._run = run  # runs a blocking store call on a database thread (ApiContext.db)
        self.metrics = metrics
        self._pending: dict[str, list[asyncio.Future]] = {}
        self._reader: asyncio.Task | None = None

    async def view(self, request_id: str) -> Any:
        """store.owner_queries.request_view, grouped: the row's view or None."""
        done = asyncio.get_running_loop().create_future()
        self._pending.setdefault(request_id, []).append(done)
        if self._reader is None or self._reader.done():
            self._reader = asyncio.create_task(self._read())
        return await done

    async def _read(self) -> None:
        while self._pending:
            ids = list(self._pending)[:MAX_GROUP]
            group = {rid: self._pending.pop(rid) for rid in ids}
            self.metrics.inc("poll_groups")
            try:
                rows = await self._run(request_views, self.store, ids)
            except Exception as exc:  # noqa: BLE001 — every lookup of the group gets it
                for waiters in group.values():
                    for done in waiters:
                        if not done.done():
                            done.set_exception(exc)
                continue
            for rid, waiters in group.items():
                row = rows.get(rid)
                for done in waiters:
                    if not done.done():
                        done.set_result(row)
