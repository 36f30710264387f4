"""Group commit for submits: the queued rows of concurrent POSTs share one transaction.

Filing a request is an INSERT whose commit waits for the database's WAL flush (a few ms
on a real disk, more on a busy one). One commit per request caps submits at
threads / flush time; here a submit joins the pending group and one flusher at a time
writes the whole group in one statement and one commit (store.owner_queries.claim_requests).
While a group is being written the next one fills, so the group grows with the load and
an idle server still writes a lone request at once (no timer, no added wait).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from inflight.api.metrics import ApiMetrics
from inflight.store import Store
from inflight.store.owner_queries import claim_requests
from inflight.store.queries import is_transient

MAX_GROUP = 500


class ClaimQueue:
    def __init__(self, store: Store, run: Callable[..., Awaitable[Any]], metrics: ApiMetrics):
        self.store = store
        self._run = run  # runs a blocking store call on a database thread (ApiContext.db)
        self.metrics = metrics
        self._pending: list[tuple[dict[str, Any], str | None, asyncio.Future]] = []
        self._flusher: asyncio.Task | None = None

    async def claim(self, row: dict[str, Any], owner: str | None) -> Any:
        """One row of store.owner_queries.claim_requests, grouped: None if this call filed the row, else the
        existing row's view."""
        done = asyncio.get_running_loop().create_future()
        self._pending.append((row, owner, done))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        return await done

    async def _flush(self) -> None:
        while self._pending:
            group, self._pending = self._pending[:MAX_GROUP], self._pending[MAX_GROUP:]
            self.metrics.inc("submit_groups")
            try:
                views = await self._run(claim_requests, self.store,
                                        [(row, owner) for row, owner, _ in group])
            except Exception as exc:  # noqa: BLE001 — settled below, each submit alone
                if len(group) == 1 or is_transient(exc):  # the database is away: all fail
                    for *_, done in group:
                        if not done.done():
                            done.set_exception(exc)
                    continue
                # NOTE: the database refused the group for one row's content: each row is
                # filed alone, so only the submit that carried it fails
                await self._one_by_one(group)
                continue
            for (*_, done), view in zip(group, views):
                if not done.done():
                    done.set_result(view)

    async def _one_by_one(self, group: list[tuple[dict[str, Any], str | None, asyncio.Future]]
                          ) -> None:
        for row, owner, done in group:
            try:
                (view,) = await self._run(claim_requests, self.store, [(row, owner)])
            except Exception as exc:  # noqa: BLE001 — this submit's own failure
                if not done.done():
                    done.set_exception(exc)
                continue
            if not done.done():
                done.set_result(view)
