"""Submit a request and answer it from its events: what chat completions, text completions
and the Messages API share.

    stream = await submit(ctx, req, owner, "chat_completions")   # filed, published, followed
    return StreamResponse(body(stream), stream, on_unfinished=...)   # streamed: at once
    return await answer_when_final(ctx, stream, render, path)      # waiting: one JSON body

A streamed answer starts at once (its first chunk before any event: the client knows it
was accepted) and sends its keep-alive while the request waits (ApiStream.next_or_idle).
A waiting answer is the final event rendered; an error event is its HTTP error
(`error_status`), provided it comes within INFLIGHT_API_KEEPALIVE_S. A request still
waiting then, with INFLIGHT_API_KEEPALIVE_WAITING on, is answered 200 at once and sends a
space every INFLIGHT_API_KEEPALIVE_S until its JSON (leading whitespace is valid JSON);
an error that comes after that is the error body in the route's shape with that 200.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from anyio import to_thread

from inflight.api.context import ApiContext
from inflight.api.errors import APIError, error_body
from inflight.api.responses import json_response
from inflight.api.streams import ApiStream, StreamResponse
from inflight.producers import RequestNotFound
from inflight.engine.sampling_params import SEED_MAX, seed_for
from inflight.producers.models_client import Route
from inflight.schemas import PRIORITY_BATCH, ErrorEvent, FinalEvent, TokenEvent
from inflight.schemas.events import (ERR_CANCELLED, ERR_EXPIRED, ERR_INVALID_REQUEST,
                                     ERR_INVALID_SCHEMA, ERR_MESSAGE_TOO_LARGE,
                                     ERR_PROMPT_TOO_LONG, ERR_WRONG_MODEL_KIND)
from inflight.store import queued_row
from inflight.api.rate_limits import admit
from inflight.store.owner_queries import release_request

_CLIENT_ERRORS = {ERR_INVALID_REQUEST, ERR_INVALID_SCHEMA, ERR_MESSAGE_TOO_LARGE, ERR_WRONG_MODEL_KIND,
                  ERR_PROMPT_TOO_LONG}
WAITING_KEEPALIVE = b" "
RESTARTED = ("the request was redone on another worker and wrote a different text; "
             "retry it")


def error_status(event: ErrorEvent) -> APIError:
    """An ErrorEvent as the HTTP error a client should get."""
    if event.code in _CLIENT_ERRORS:
        return APIError(400, event.message, param=event.field, code=event.code)
    if event.code in (ERR_CANCELLED, ERR_EXPIRED):
        return APIError(409, f"the request was {event.code}: {event.message}", code=event.code)
    return APIError(500, f"the worker could not run this request ({event.code}): "
                         f"{event.message}", code=event.code)


def timeout_error(ctx: ApiContext, exc: Exception) -> APIError:
    return APIError(504, f"no answer within {ctx.settings.api_wait_timeout_s:.0f}s "
                         f"(INFLIGHT_API_WAIT_TIMEOUT_S); is a worker running? ({exc})",
                    code="timeout")


async def submit(ctx: ApiContext, req: Any, owner: str | None, metric: str,
                 route: Route | None = None, key: str | None = None) -> ApiStream:
    """File `req` for `owner`, publish it to its model's topic (`route`: ctx.models.resolve,
    None: the default model) and follow its events; the caller closes the stream or hands
    it to the response that does (api/streams.py). `key`: the Kafka key (None: its id)."""
    if route is not None:
        req = routed(req, route)
    req = for_owner(req, owner)
    row = queued_row(req, route.name if route else None)
    row["tokens"] = admit(req)  # 429 when over the caller's limits (api/rate_limits.py)
    existing = await ctx.claims.claim(row, owner)
    if existing is not None:  # a fresh uuid: cannot happen unless the uuid source is broken
        raise APIError(500, "request id collision; retry")
    stream = await open_and_publish(ctx, req, owner,
                                    route.topic(req.priority >= PRIORITY_BATCH) if route else None,
                                    key)
    ctx.metrics.inc(metric)
    ctx.metrics.submitted(route.name if route is not None else ctx.models.default.name, metric)
    return stream


def for_owner(req: Any, owner: str | None) -> Any:
    """The request with the caller key's owner as its tenant (fair share, limits, usage);
    with authentication off (no owner) the request keeps what it says."""
    return req if owner is None or req.tenant == owner else req.model_copy(update={"tenant": owner})


def routed(req: Any, route: Route) -> Any:
    """The request as its model's workers read it (no `model` for the default model)."""
    return req if req.model == route.model else req.model_copy(update={"model": route.model})


async def open_and_publish(ctx: ApiContext, req: Any, owner: str | None,
                           topic: str | None = None, key: str | None = None) -> ApiStream:
    """Follow the filed request, then publish it: every event of it lands in the stream,
    so it needs no replay. A refused publish unfiles the request (the client may retry)."""
    try:
        stream = ctx.streams.open(req.request_id, None)
    except BaseException:
        await ctx.db(release_request, ctx.store, req.request_id, owner)
        raise
    try:
        await ctx.publish(req, topic, key)
    except BaseException:
        stream.close()
        await ctx.db(release_request, ctx.store, req.request_id, owner)
        raise
    return stream


async def cancel_quietly(ctx: ApiContext, rid: str) -> None:
    """The client went away mid-answer: stop generating for nobody."""
    await to_thread.run_sync(ctx.client.cancel, rid)


async def answer_when_final(ctx: ApiContext, stream: ApiStream,
                            render: Callable[[FinalEvent], dict[str, Any]], path: str) -> Any:
    """The waiting answer of a submitted request (module doc): `render(final)` as JSON.
    `path`: the route's, for the shape of a late error (api/errors.py)."""
    waiting = ctx.settings.api_keepalive_waiting and ctx.settings.api_keepalive_s > 0
    try:
        event = await stream.next_or_idle() if waiting else await stream.next()
        while isinstance(event, TokenEvent):  # the final's text as one delta first
            event = await stream.next_or_idle() if waiting else await stream.next()
    except RequestNotFound as exc:
        stream.close()
        raise timeout_error(ctx, exc) from None
    except BaseException:
        stream.close()
        raise
    if event is None:
        return StreamResponse(_waiting_body(ctx, stream, render, path), stream,
                              media_type="application/json",
                              headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                              on_unfinished=lambda: cancel_quietly(ctx, stream.request_id))
    stream.close()
    if isinstance(event, ErrorEvent):
        raise error_status(event)
    return json_response(render(event))


async def _waiting_body(ctx: ApiContext, stream: ApiStream,
                        render: Callable[[FinalEvent], dict[str, Any]],
                        path: str) -> AsyncIterator[bytes]:
    yield WAITING_KEEPALIVE
    while True:
        try:
            event = await stream.next_or_idle()
        except RequestNotFound as exc:
            err = timeout_error(ctx, exc)
            yield orjson.dumps(error_body(path, err.status, err.message, err.param, err.code))
            return
        if event is None:
            yield WAITING_KEEPALIVE
        elif isinstance(event, FinalEvent):
            yield orjson.dumps(render(event))
            return
        elif isinstance(event, ErrorEvent):
            err = error_status(event)
            yield orjson.dumps(error_body(path, err.status, err.message, err.param, err.code))
            return


async def answer_siblings(ctx: ApiContext, req: Any, n: int, seed: int | None,
                          owner: str | None, metric: str, route: Route,
                          render: Callable[[FinalEvent, str], dict[str, Any]]) -> Any:
    """`n` > 1 without stream: n sibling requests `{id}-{i}`, all with the parent id as
    their Kafka key (one partition, one worker: the scheduler computes their shared prompt
    once and the others hit the prefix cache), each with its own seed (the user's `seed`
    + i, else `seed_for` of its id); one answer once all are final, `render(final, id)`'s
    choices as index 0..n-1 and usage as OpenAI counts it (the prompt once, the completion
    tokens summed). The first error (or timeout) is the answer; the others are cancelled.
    """
    rid = req.request_id
    streams: list[ApiStream] = []
    finals: list[Any] = []
    try:
        for i in range(n):
            sid = f"{rid}-{i}"
            own = seed_for(sid) if seed is None else (seed + i) % (SEED_MAX + 1)
            sib = req.model_copy(update={"request_id": sid,
                                         "params": dataclasses.replace(req.params, seed=own)})
            streams.append(await submit(ctx, sib, owner, metric, route, key=rid))
        waits = [asyncio.ensure_future(_final(s)) for s in streams]
        try:
            finals = list(await asyncio.gather(*waits))
        finally:  # one timed out: the other waits end too (a no-op for finished ones)
            for wait in waits:
                wait.cancel()
    except RequestNotFound as exc:
        raise timeout_error(ctx, exc) from None
    finally:
        for s in streams:
            s.close()
        if len(finals) < len(streams):  # a failed submit or a timeout: stop the others
            for s in streams:
                await cancel_quietly(ctx, s.request_id)
    for event in finals:
        if isinstance(event, ErrorEvent):
            for other in streams:
                await cancel_quietly(ctx, other.request_id)
            raise error_status(event)
    bodies = [render(final, s.request_id) for final, s in zip(finals, streams)]
    body = render(finals[0], rid)
    body["choices"] = [dict(b["choices"][0], index=i) for i, b in enumerate(bodies)]
    p = body["usage"]["prompt_tokens"]
    c = sum(b["usage"]["completion_tokens"] for b in bodies)
    body["usage"] = {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}
    return json_response(body)


async def _final(stream: ApiStream) -> Any:
    """The final (or error) event of a followed request."""
    event = await stream.next()
    while isinstance(event, TokenEvent):
        event = await stream.next()
    return event


class SentText:
    """What a chunk stream has sent, across attempts (text, and logprobs by token).

    Client.stream starts the text over (a delta with index 0) when a request is redone on
    another worker. Sent chunks cannot be taken back, so the new attempt's text is sent
    only past what was already sent, and only while it repeats that text exactly (greedy or
    seeded sampling does); a redo that writes something else ends the stream with an error.
    """

    def __init__(self) -> None:
        self.sent = ""
        self.current = ""
        self.num_sent = 0      # tokens whose logprobs went out, across attempts
        self.num_current = 0   # tokens of the current attempt so far
        self.logprobs: list = []  # logprob entries to send (past those sent), if asked for

    def feed(self, event: TokenEvent) -> str | None:
        """The text to send now ("" for nothing), or None when the redo diverged; the
        event's logprob entries past those already sent are added to `logprobs`."""
        if event.index == 0:
            self.current = ""
            self.num_current = 0
        start = self.num_current
        self.num_current += len(event.token_ids)
        if event.logprobs is not None and self.num_current > self.num_sent:
            self.logprobs += event.logprobs[max(self.num_sent - start, 0):]
            self.num_sent = self.num_current
        self.current += event.text
        if self.current.startswith(self.sent):
            delta, self.sent = self.current[len(self.sent):], self.current
            return delta
        return "" if self.sent.startswith(self.current) else None
