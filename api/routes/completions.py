"""POST /v1/completions (OpenAI's legacy text API) through the queue, as a chat completion
goes (api/routes/chat.py): filed, published at interactive priority, answered from its
events (api/follow.py) -- one `text_completion` object, or `stream: true` for
`text_completion` chunks and `[DONE]` (an SSE comment at once and every
INFLIGHT_API_KEEPALIVE_S while the request waits). The prompt is a string or token ids;
`echo` and `logprobs` (the legacy object, of the prompt too with echo) are what
evaluation harnesses use to score text.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter

from inflight.api.context import ApiContext
from inflight.api.deps import Caller, Ctx
from inflight.api.models.completions import Completion, CompletionRequest, chunk, completion
from inflight.api.models.errors import OPENAI_ERRORS, WAIT_ERRORS
from inflight.api.follow import (RESTARTED, SentText, answer_when_final, cancel_quietly,
                                 error_status, submit, timeout_error, answer_siblings)
from inflight.api.routing import ApiRoute
from inflight.api.sse import sse
from inflight.api.streams import SSE_KEEPALIVE, ApiStream, StreamResponse
from inflight.producers import RequestNotFound
from inflight.schemas import ErrorEvent, FinalEvent, TokenEvent

router = APIRouter(route_class=ApiRoute, tags=["completions"], responses=OPENAI_ERRORS)


PATH = "/v1/completions"


@router.post(PATH, response_model=Completion,
             responses={200: {"content": {"text/event-stream": {}},
                              "description": "with stream=true: text_completion chunks"},
                        **WAIT_ERRORS},
             summary="OpenAI-compatible text completion (through the queue)")
async def completions(body: CompletionRequest, ctx: Ctx, caller: Caller) -> Any:
    route = ctx.models.resolve(body.model)
    model = route.name
    rid = uuid.uuid4().hex
    req = body.to_wire(rid, ctx.settings.max_prompt_chars, ctx.settings.kafka_max_message_bytes)
    if (body.n or 1) > 1:
        return await answer_siblings(ctx, req, body.n, body.seed, caller.owner, "completions",
                                     route, lambda final, sid: completion(sid, model, body, final))
    stream = await submit(ctx, req, caller.owner, "completions", route)
    if not body.stream:
        return await answer_when_final(ctx, stream,
                                       lambda final: completion(rid, model, body, final), PATH)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    echo = body.prompt_text if body.echo else None
    return StreamResponse(_chunks(ctx, rid, model, stream, include_usage, echo), stream,
                          on_unfinished=lambda: cancel_quietly(ctx, rid))


async def _chunks(ctx: ApiContext, rid: str, model: str, stream: ApiStream,
                  include_usage: bool, echo: str | None) -> AsyncIterator[bytes]:
    created = int(time.time())

    def data(text: str, finish: str | None = None, usage: dict[str, int] | None = None,
             choices: bool = True) -> bytes:
        return sse(None, orjson.dumps(chunk(rid, model, created, text, finish, usage,
                                            with_usage=include_usage, choices=choices)))

    def error(message: str, kind: str, code: str | None, param: str | None = None) -> bytes:
        return sse(None, orjson.dumps({"error": {"message": message, "type": kind,
                                                 "param": param, "code": code}}))

    sent = SentText()
    yield data(echo) if echo else SSE_KEEPALIVE  # a first byte at once: accepted
    while True:
        try:
            event = await stream.next_or_idle()
        except RequestNotFound as exc:
            err = timeout_error(ctx, exc)
            yield error(err.message, "timeout_error", err.code)
            break
        if event is None:
            yield SSE_KEEPALIVE
        elif isinstance(event, TokenEvent):
            delta = sent.feed(event)
            if delta is None:
                yield error(RESTARTED, "server_error", "restarted")
                break
            if delta:
                yield data(delta)
        elif isinstance(event, FinalEvent):
            yield data("", "length" if event.finish_reason == "length" else "stop")
            if include_usage:
                p, c = event.usage.prompt_tokens, event.usage.completion_tokens
                yield data("", usage={"prompt_tokens": p, "completion_tokens": c,
                                      "total_tokens": p + c}, choices=False)
            break
        elif isinstance(event, ErrorEvent):
            err = error_status(event)
            yield error(err.message, "server_error" if err.status >= 500
                        else "invalid_request_error", err.code, err.param)
            break
    yield b"data: [DONE]\n\n"
