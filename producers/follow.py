"""One followed request, as the process's results reader hands it out
(producers/results_reader.py): its stream, assembled (producers/stream.py: deltas in index
order, a new attempt starts the text over, then the final), in a queue of its own.

    with reader.follow(rid, since=t) as f:            # a thread (Client.stream, Client.wait)
        for event in f.events(deadline, on_timeout): ...
    f = reader.follow_async(rid, since=None)          # the API's event loop
    try:
        event = await f.next(deadline)
    finally:
        f.close()

The reader thread assembles and pushes; only the follower takes. `close()` ends the follow
(idempotent) and frees its place among the reader's follows, whatever state it is in.
"""

from __future__ import annotations

import asyncio
import collections
import queue
import time
from collections.abc import Callable, Iterator
from typing import Protocol

from inflight.schemas import ErrorEvent, FinalEvent

from inflight.producers.stream import StreamAssembler, StreamEvent


class FollowRegistry(Protocol):
    """Where a follow is registered (producers.results_reader.ResultsReader)."""

    def unfollow(self, f: Follow) -> None: ...


class Follow:
    """What the reader keeps of one follow; subclasses say how the follower is woken."""

    def __init__(self, reader: FollowRegistry, request_id: str, since: float | None):
        self.reader = reader
        self.request_id = request_id
        self.key = request_id.encode()
        # None: registered before the request was published (nothing to replay);
        # else: no event of the request was appended before this instant (epoch s)
        self.since = since
        self.assembler = StreamAssembler()   # the reader thread's alone
        self.closed = False
        self.finished = False                # the final (or an error final) was handed over
        self.opened_at = time.monotonic()

    # -- the reader thread ----------------------------------------------------------------
    def push(self, events: list[StreamEvent | BaseException]) -> None:
        raise NotImplementedError

    def fail(self, exc: BaseException) -> None:
        """The reader gives up on this follow (it is closing): the follower gets `exc`."""
        self.push([exc])

    # -- the follower -------------------------------------------------------------------------
    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.reader.unfollow(self)

    def _taken(self, item: StreamEvent | BaseException) -> StreamEvent:
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, (FinalEvent, ErrorEvent)):
            self.finished = True
        return item

    def __enter__(self) -> "Follow":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncFollow(Follow):
    """For a thread: a blocking queue."""

    def __init__(self, reader: FollowRegistry, request_id: str, since: float | None):
        super().__init__(reader, request_id, since)
        self._q: queue.SimpleQueue[StreamEvent | BaseException] = queue.SimpleQueue()

    def push(self, events: list[StreamEvent | BaseException]) -> None:
        for e in events:
            self._q.put(e)

    def get(self, deadline: float) -> StreamEvent:
        """The next event; TimeoutError once `deadline` (time.monotonic()) passes."""
        try:
            item = self._q.get(timeout=max(deadline - time.monotonic(), 0.0))
        except queue.Empty:
            raise TimeoutError from None
        return self._taken(item)

    def events(self, deadline: float,
               on_timeout: Callable[[], Exception]) -> Iterator[StreamEvent]:
        """The stream up to and including its final; `on_timeout()` is raised at the deadline."""
        while not self.finished:
            try:
                yield self.get(deadline)
            except TimeoutError:
                raise on_timeout() from None


class AsyncFollow(Follow):
    """For an event loop: a deque the reader fills, and a future it resolves (through the
    loop, once per batch of records for all of the loop's follows)."""

    def __init__(self, reader: FollowRegistry, request_id: str, since: float | None,
                 loop: asyncio.AbstractEventLoop):
        super().__init__(reader, request_id, since)
        self.loop = loop
        self._items: collections.deque[StreamEvent | BaseException] = collections.deque()
        self._waiter: asyncio.Future | None = None

    def push(self, events: list[StreamEvent | BaseException]) -> None:
        self._items.extend(events)           # deque.extend is atomic; the loop wakes later

    def wake(self) -> None:
        """On the loop: the reader pushed something."""
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def next(self, deadline: float) -> StreamEvent:
        """The next event; TimeoutError once `deadline` (time.monotonic()) passes."""
        while not self._items:
            # NOTE: no await between the check above and the new waiter, and wake() runs on
            # this loop after the push, so a push is never missed
            self._waiter = self.loop.create_future()
            try:
                await asyncio.wait_for(self._waiter, max(deadline - time.monotonic(), 0.0))
            except asyncio.TimeoutError:  # not the builtin before Python 3.11
                raise TimeoutError from None
            finally:
                self._waiter = None
        return self._taken(self._items.popleft())
