"""The open streams of one API process: SSE (`/v1/requests/{id}/events`), streamed and
waiting chat and text completions. Each follows its request through the process's one
results reader (producers/results_reader.py): no Kafka consumer of its own, no thread.

    stream = ctx.streams.open(rid, since)    # 503 when INFLIGHT_API_MAX_STREAMS are open
    event = await stream.next()              # RequestNotFound after INFLIGHT_API_WAIT_TIMEOUT_S
    event = await stream.next_or_idle()      # None after INFLIGHT_API_KEEPALIVE_S without one
    return StreamResponse(body, stream, on_unfinished=...)   # closes it, whatever happens

Keep-alive: a body that waits with `next_or_idle()` sends its keep-alive (an SSE comment,
Anthropic's `ping`, a space before a JSON body) each time it gets None, so a client or
proxy with a read timeout does not drop a request that waits in the queue.

NOTE (every path releases): the stream is closed by whoever holds it last. A handler that
answers at once (a waiting completion, an error) closes it itself; a streamed answer hands
it to StreamResponse, which closes it when the response ends for any reason -- finished,
client gone (before or after the first byte), an error in the body, cancelled -- even if
the body's generator never started. `on_unfinished` runs then if no final event was
taken (a streamed chat completion cancels its request: nobody reads it any more).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from inflight.api.errors import APIError
from inflight.api.metrics import ApiMetrics
from inflight.producers import RequestNotFound
from inflight.producers.follow import AsyncFollow
from inflight.producers.results_reader import ResultsReader
from inflight.schemas.errors import CapacityError

log = logging.getLogger("inflight.api")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
SSE_KEEPALIVE = b": keep-alive\n\n"   # an SSE comment: every SSE client skips it


class Streams:
    def __init__(self, reader: ResultsReader, metrics: ApiMetrics, timeout_s: float,
                 keepalive_s: float = 0.0):
        self.reader = reader
        self.metrics = metrics
        self.timeout_s = timeout_s
        self.keepalive_s = keepalive_s   # 0: no keep-alive (next_or_idle waits to the deadline)

    @property
    def limit(self) -> int:
        return self.reader.max_follows

    def open(self, request_id: str, since: float | None) -> "ApiStream":
        """Follow `request_id` (`since`: see ResultsReader.follow; None before publishing)."""
        try:
            follow = self.reader.follow_async(request_id, since)
        except CapacityError:
            raise APIError(503, f"too many open streams on this server ({self.limit}, setting "
                                "INFLIGHT_API_MAX_STREAMS); retry shortly or poll "
                                "GET /v1/requests/{id}", code="overloaded",
                           headers={"Retry-After": "2"}) from None
        self.metrics.open_streams += 1
        self.metrics.inc("streams_opened")
        return ApiStream(self, follow)


class ApiStream:
    """One request's events (producers/stream.py's order) for a handler."""

    def __init__(self, streams: Streams, follow: AsyncFollow):
        self.streams = streams
        self.follow = follow
        self.request_id = follow.request_id
        self.deadline = time.monotonic() + streams.timeout_s
        self.closed = False

    @property
    def finished(self) -> bool:
        """The final (or error) event was taken."""
        return self.follow.finished

    async def next(self) -> Any:
        """The next event; RequestNotFound when none comes before the deadline."""
        try:
            return await self.follow.next(self.deadline)
        except TimeoutError:
            raise RequestNotFound(f"no final event for request {self.request_id} within "
                                  f"{self.streams.timeout_s:.0f}s") from None

    async def next_or_idle(self) -> Any | None:
        """The next event, or None when INFLIGHT_API_KEEPALIVE_S pass first (the caller
        sends its keep-alive and asks again); RequestNotFound at the deadline."""
        idle = self.streams.keepalive_s
        if idle <= 0:
            return await self.next()
        until = min(self.deadline, time.monotonic() + idle)
        try:
            return await self.follow.next(until)
        except TimeoutError:
            if until < self.deadline:
                return None
            raise RequestNotFound(f"no final event for request {self.request_id} within "
                                  f"{self.streams.timeout_s:.0f}s") from None

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.follow.close()
            self.streams.metrics.open_streams -= 1


class StreamResponse(StreamingResponse):
    """A streamed answer that owns its ApiStream (module NOTE)."""

    def __init__(self, content: Any, stream: ApiStream, *,
                 on_unfinished: Callable[[], Awaitable[None]] | None = None, **kw: Any):
        kw.setdefault("media_type", "text/event-stream")
        kw.setdefault("headers", SSE_HEADERS)
        super().__init__(content, **kw)
        self.stream = stream
        self.on_unfinished = on_unfinished

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.stream.close()
            if self.on_unfinished is not None and not self.stream.finished:
                with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                    await self.on_unfinished()
