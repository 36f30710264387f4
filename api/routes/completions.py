"""POST /v1/completions (OpenAI's legacy text API) through the queue, as a chat completion
goes (api/routes/chat.py): filed, published at interactive priority, answered from its
events -- one `text_completion` object, or `stream: true` for `text_completion` chunks
and `[DONE]`. The prompt is a string or token ids; `echo` and `logprobs` (the legacy
object, of the prompt too with echo) are what evaluation harnesses use to score text.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
import orjson
from anyio import to_thread
from fastapi import APIRouter
from fastapi.responses import StreamingResponse

from inflight.api.context import ApiContext
from inflight.api.deps import Caller, Ctx
from inflight.api.models.completions import Completion, CompletionRequest, chunk, completion
from inflight.api.models.errors import OPENAI_ERRORS, WAIT_ERRORS
from inflight.api.responses import json_response
from inflight.api.routes.chat import SentText, _next, _timeout, error_status
from inflight.api.routing import ApiRoute
from inflight.api.sse import sse
from inflight.producers import RequestNotFound
from inflight.schemas import ErrorEvent, FinalEvent, TokenEvent
from inflight.store import queued_row
from inflight.store.owned import release_request

router = APIRouter(route_class=ApiRoute, tags=["completions"], responses=OPENAI_ERRORS)


@router.post("/v1/completions", response_model=Completion,
             responses={200: {"content": {"text/event-stream": {}},
                              "description": "with stream=true: text_completion chunks"},
                        **WAIT_ERRORS},
             summary="OpenAI-compatible text completion (through the queue)")
async def completions(body: CompletionRequest, ctx: Ctx, caller: Caller) -> Any:
    model = ctx.models.resolve(body.model).id
    rid = uuid.uuid4().hex
    req = body.to_wire(rid, ctx.settings.max_prompt_chars, ctx.settings.kafka_max_message_bytes)
    existing = await ctx.claims.claim(queued_row(req), caller.owner)
    if existing is not None:  # a fresh uuid: cannot happen unless the uuid source is broken
        raise RuntimeError("request id collision")
    try:
        await ctx.publish(req)
    except BaseException:
        await ctx.db(release_request, ctx.store, rid, caller.owner)
        raise
    ctx.metrics.inc("completions")
    ctx.streams.acquire()
    events = ctx.streams.iterate(ctx.client.stream(rid, timeout=ctx.settings.api_wait_timeout_s,
                                                   since=req.submitted_at))
    try:
        first = await _next(ctx, events)
        if isinstance(first, ErrorEvent):
            raise error_status(first)
        if not body.stream:
            final = first
            while not isinstance(final, (FinalEvent, ErrorEvent)):
                final = await _next(ctx, events)
            if isinstance(final, ErrorEvent):
                raise error_status(final)
            answer = json_response(completion(rid, model, body, final))
    except BaseException:
        ctx.streams.release()
        with anyio.CancelScope(shield=True):
            await events.aclose()
        raise
    if not body.stream:  # answered whole: its slot and reader go now (a stream's in _chunks)
        ctx.streams.release()
        with anyio.CancelScope(shield=True):
            await events.aclose()
        return answer
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    echo = body.prompt_text if body.echo else None
    return StreamingResponse(_chunks(ctx, rid, model, first, events, include_usage, echo),
                             media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _chunks(ctx: ApiContext, rid: str, model: str, first: Any, events: AsyncIterator[Any],
                  include_usage: bool, echo: str | None) -> AsyncIterator[bytes]:
    created = int(time.time())
    finished = False

    def data(text: str, finish: str | None = None, usage: dict[str, int] | None = None,
             choices: bool = True) -> bytes:
        return sse(None, orjson.dumps(chunk(rid, model, created, text, finish, usage,
                                            with_usage=include_usage, choices=choices)))

    def error(message: str, kind: str, code: str | None, param: str | None = None) -> bytes:
        return sse(None, orjson.dumps({"error": {"message": message, "type": kind,
                                                 "param": param, "code": code}}))

    sent = SentText()
    try:
        if echo:
            yield data(echo)
        event = first
        while True:
            if isinstance(event, TokenEvent):
                delta = sent.feed(event)
                if delta is None:
                    yield error("the request was redone on another worker and wrote a "
                                "different text; retry it", "server_error", "restarted")
                    break
                if delta:
                    yield data(delta)
            elif isinstance(event, FinalEvent):
                finished = True
                yield data("", "length" if event.finish_reason == "length" else "stop")
                if include_usage:
                    p, c = event.usage.prompt_tokens, event.usage.completion_tokens
                    yield data("", usage={"prompt_tokens": p, "completion_tokens": c,
                                          "total_tokens": p + c}, choices=False)
                break
            elif isinstance(event, ErrorEvent):
                finished = True
                err = error_status(event)
                yield error(err.message, "server_error" if err.status >= 500
                            else "invalid_request_error", err.code, err.param)
                break
            try:
                event = await events.__anext__()
            except StopAsyncIteration:
                break
            except RequestNotFound as exc:
                err = _timeout(ctx, exc)
                yield error(err.message, "timeout_error", err.code)
                break
        yield b"data: [DONE]\n\n"
    finally:
        ctx.streams.release()
        with anyio.CancelScope(shield=True):  # cleanup runs even when the client left
            with contextlib.suppress(Exception):
                await events.aclose()
            if not finished:  # the client went away mid-answer: stop generating for nobody
                with contextlib.suppress(Exception):
                    await to_thread.run_sync(ctx.client.cancel, rid)
