"""POST /v1/chat/completions through the queue, so OpenAI chat clients work unchanged.

The request is filed and published like POST /v1/requests (interactive priority), then
the handler reads its events through the process's results reader (api/streams.py) and
answers:
- `stream: false`: one chat.completion once the final event arrives;
- `stream: true`: chat.completion.chunk events as token deltas arrive, then `[DONE]`.
The first event is awaited before answering, so bad input (a prompt over the model's
context, say) is still an HTTP 400, not a broken stream. A streaming client that goes
away cancels its request.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
from anyio import to_thread
from fastapi import APIRouter

from inflight.api.context import ApiContext
from inflight.api.deps import Caller, Ctx
from inflight.api.errors import APIError
from inflight.api.models.chat import (ChatCompletion, ChatCompletionRequest, chunk, completion,
                             finish_of, usage_of)
from inflight.api.models.errors import OPENAI_ERRORS, WAIT_ERRORS
from inflight.api.responses import json_response
from inflight.api.routing import ApiRoute
from inflight.api.sse import sse
from inflight.api.streams import ApiStream, StreamResponse
from inflight.producers import RequestNotFound
from inflight.schemas import ErrorEvent, FinalEvent, TokenEvent
from inflight.schemas.events import (ERR_CANCELLED, ERR_EXPIRED, ERR_INVALID_REQUEST,
                            ERR_INVALID_SCHEMA, ERR_MESSAGE_TOO_LARGE, ERR_PROMPT_TOO_LONG)
from inflight.schemas.tool_stream import ToolCallStream
from inflight.store import queued_row
from inflight.store.owner_queries import release_request

router = APIRouter(route_class=ApiRoute, tags=["chat"], responses=OPENAI_ERRORS)

_CLIENT_ERRORS = {ERR_INVALID_REQUEST, ERR_INVALID_SCHEMA, ERR_MESSAGE_TOO_LARGE,
                  ERR_PROMPT_TOO_LONG}


def error_status(event: ErrorEvent) -> APIError:
    """An ErrorEvent as the HTTP error a chat client should get."""
    if event.code in _CLIENT_ERRORS:
        return APIError(400, event.message, param=event.field, code=event.code)
    if event.code in (ERR_CANCELLED, ERR_EXPIRED):
        return APIError(409, f"the request was {event.code}: {event.message}", code=event.code)
    return APIError(500, f"the worker could not run this request ({event.code}): "
                         f"{event.message}", code=event.code)


def _timeout(ctx: ApiContext, exc: Exception) -> APIError:
    return APIError(504, f"no answer within {ctx.settings.api_wait_timeout_s:.0f}s "
                         f"(INFLIGHT_API_WAIT_TIMEOUT_S); is a worker running? ({exc})",
                    code="timeout")


@router.post("/v1/chat/completions", response_model=ChatCompletion,
             responses={200: {"content": {"text/event-stream": {}},
                              "description": "with stream=true: chat.completion.chunk events"},
                        **WAIT_ERRORS},
             summary="OpenAI-compatible chat completion (through the queue)")
async def chat_completions(body: ChatCompletionRequest, ctx: Ctx, caller: Caller) -> Any:
    model = ctx.models.resolve(body.model).id  # an unknown model is a 404, as OpenAI's
    rid = uuid.uuid4().hex
    req = body.to_wire(rid, ctx.settings.max_prompt_chars, ctx.settings.kafka_max_message_bytes)
    stream, event = await submit_and_follow(ctx, req, caller.owner, "chat_completions", to_final=not body.stream)
    if not body.stream:
        return json_response(completion(rid, model, event))
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    calls = ToolCallStream(rid) if req.tools is not None and req.tool_choice != "none" else None
    return StreamResponse(_chunks(ctx, rid, model, event, stream, include_usage, calls),
                          stream, on_unfinished=lambda: cancel_quietly(ctx, rid))


async def submit_and_follow(ctx: ApiContext, req: Any, owner: str | None, metric: str,
                            to_final: bool) -> tuple[ApiStream, Any]:
    """File `req` for `owner`, publish it and wait for its first event, or with `to_final`
    for its final one (the stream is closed then). An error event raises its status; the
    stream is closed on every way out but a streamed answer's (its response closes it)."""
    existing = await ctx.claims.claim(queued_row(req), owner)
    if existing is not None:  # a fresh uuid: cannot happen unless the uuid source is broken
        raise APIError(500, "request id collision; retry")
    stream = await open_and_publish(ctx, req, owner)
    ctx.metrics.inc(metric)
    try:
        event = await _next(ctx, stream)
        while to_final and not isinstance(event, (FinalEvent, ErrorEvent)):
            event = await _next(ctx, stream)
        if isinstance(event, ErrorEvent):
            raise error_status(event)
    except BaseException:
        stream.close()
        raise
    if to_final:
        stream.close()
    return stream, event


async def open_and_publish(ctx: ApiContext, req: Any, owner: str | None) -> ApiStream:
    """Follow the filed request, then publish it: every event of it lands in the stream,
    so it needs no replay. A refused publish unfiles the request (the client may retry)."""
    try:
        stream = ctx.streams.open(req.request_id, None)
    except BaseException:
        await ctx.db(release_request, ctx.store, req.request_id, owner)
        raise
    try:
        await ctx.publish(req)
    except BaseException:
        stream.close()
        await ctx.db(release_request, ctx.store, req.request_id, owner)
        raise
    return stream


async def cancel_quietly(ctx: ApiContext, rid: str) -> None:
    """The client went away mid-answer: stop generating for nobody."""
    await to_thread.run_sync(ctx.client.cancel, rid)


class SentText:
    """What a chunk stream has sent, across attempts.

    Client.stream starts the text over (a delta with index 0) when a request is redone on
    another worker. Sent chunks cannot be taken back, so the new attempt's text is sent
    only past what was already sent, and only while it repeats that text exactly (greedy or
    seeded sampling does); a redo that writes something else ends the stream with an error.
    """

    def __init__(self) -> None:
        self.sent = ""
        self.current = ""

    def feed(self, event: TokenEvent) -> str | None:
        """The text to send now ("" for nothing), or None when the redo diverged."""
        if event.index == 0:
            self.current = ""
        self.current += event.text
        if self.current.startswith(self.sent):
            delta, self.sent = self.current[len(self.sent):], self.current
            return delta
        return "" if self.sent.startswith(self.current) else None


async def _next(ctx: ApiContext, stream: ApiStream) -> Any:
    try:
        return await stream.next()
    except RequestNotFound as exc:
        raise _timeout(ctx, exc) from None


async def _chunks(ctx: ApiContext, rid: str, model: str, first: Any,
                  stream: ApiStream, include_usage: bool,
                  calls: ToolCallStream | None = None) -> AsyncIterator[bytes]:
    """`calls`: the request has tools; its text deltas go out as content and tool-call
    deltas (schemas.tool_stream), and a request that called ends with "tool_calls"."""
    created = int(time.time())

    def data(body: dict[str, Any]) -> bytes:
        return sse(None, orjson.dumps(body))

    text = SentText()
    yield data(chunk(rid, model, created, {"role": "assistant", "content": ""},
                     with_usage=include_usage))
    event = first
    while True:
        if isinstance(event, TokenEvent):
            delta = text.feed(event)
            if delta is None:
                yield data({"error": {"message": "the request was redone on another "
                                      "worker and wrote a different text; retry it",
                                      "type": "server_error", "param": None,
                                      "code": "restarted"}})
                break
            for d in (calls.feed(delta) if calls is not None else [{"content": delta}]
                      if delta else []):
                yield data(chunk(rid, model, created, d, with_usage=include_usage))
        elif isinstance(event, FinalEvent):
            reason = finish_of(event.finish_reason)
            if calls is not None:
                for d in calls.finish():
                    yield data(chunk(rid, model, created, d, with_usage=include_usage))
                if calls.calls and event.tool_calls and reason == "stop":
                    reason = "tool_calls"
            yield data(chunk(rid, model, created, {}, reason, with_usage=include_usage))
            if include_usage:
                yield data(chunk(rid, model, created, None, usage=usage_of(event.usage),
                                 with_usage=True))
            break
        elif isinstance(event, ErrorEvent):
            err = error_status(event)
            yield data({"error": {"message": err.message, "type": "server_error"
                                  if err.status >= 500 else "invalid_request_error",
                                  "param": err.param, "code": err.code}})
            break
        try:
            event = await stream.next()
        except RequestNotFound as exc:
            err = _timeout(ctx, exc)
            yield data({"error": {"message": err.message, "type": "timeout_error",
                                  "param": None, "code": err.code}})
            break
    yield b"data: [DONE]\n\n"
