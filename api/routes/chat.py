"""POST /v1/chat/completions through the queue, so OpenAI chat clients work unchanged.

The request is filed and published like POST /v1/requests (interactive priority), then
the handler reads its events through the process's results reader (api/streams.py) and
answers (api/follow.py):
- `stream: false`: one chat.completion once the final event arrives (a space every
  INFLIGHT_API_KEEPALIVE_S before it while the request waits in the queue);
- `stream: true`: the role chunk at once, an SSE comment every INFLIGHT_API_KEEPALIVE_S
  while it waits, chat.completion.chunk events as token deltas arrive, then `[DONE]`.
Bad input the API can see is a 400 before anything is sent; what only the worker sees (a
prompt over the model's context) is the HTTP error of a waiting answer that comes in
time, and an error chunk in a stream. A streaming client that goes away cancels its
request.
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
from inflight.api.follow import (RESTARTED, SentText, answer_when_final, cancel_quietly,
                                 error_status, submit, timeout_error, answer_siblings)
from inflight.api.models.chat import (ChatCompletion, ChatCompletionRequest, chunk, completion,
                                      finish_of, usage_of)
from inflight.api.models.errors import OPENAI_ERRORS, WAIT_ERRORS
from inflight.api.routing import ApiRoute
from inflight.api.sse import sse
from inflight.api.streams import SSE_KEEPALIVE, ApiStream, StreamResponse
from inflight.producers import RequestNotFound
from inflight.schemas import ErrorEvent, FinalEvent, TokenEvent
from inflight.schemas.tool_stream import ToolCallStream

router = APIRouter(route_class=ApiRoute, tags=["chat"], responses=OPENAI_ERRORS)
PATH = "/v1/chat/completions"


@router.post(PATH, response_model=ChatCompletion,
             responses={200: {"content": {"text/event-stream": {}},
                              "description": "with stream=true: chat.completion.chunk events"},
                        **WAIT_ERRORS},
             summary="OpenAI-compatible chat completion (through the queue)")
async def chat_completions(body: ChatCompletionRequest, ctx: Ctx, caller: Caller) -> Any:
    route = ctx.models.resolve(body.model)
    model = route.name  # an unknown model is a 404, as OpenAI's
    rid = uuid.uuid4().hex
    req = body.to_wire(rid, ctx.settings.max_prompt_chars, ctx.settings.kafka_max_message_bytes)
    tools = req.tools is not None and req.tool_choice != "none"
    if (body.n or 1) > 1:
        return await answer_siblings(ctx, req, body.n, body.seed, caller.owner, "chat_completions",
                                     route, lambda final, sid: completion(sid, model, final, tools))
    stream = await submit(ctx, req, caller.owner, "chat_completions", route)
    if not body.stream:
        return await answer_when_final(ctx, stream,
                                       lambda final: completion(rid, model, final, tools), PATH)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    calls = ToolCallStream(rid) if tools else None
    return StreamResponse(_chunks(ctx, rid, model, stream, include_usage, calls),
                          stream, on_unfinished=lambda: cancel_quietly(ctx, rid))


async def _chunks(ctx: ApiContext, rid: str, model: str, stream: ApiStream,
                  include_usage: bool,
                  calls: ToolCallStream | None = None) -> AsyncIterator[bytes]:
    """`calls`: the request has tools; its text deltas go out as content and tool-call
    deltas (schemas.tool_stream), and a request that called ends with "tool_calls"."""
    created = int(time.time())

    def data(body: dict[str, Any]) -> bytes:
        return sse(None, orjson.dumps(body))

    def error(message: str, kind: str, code: str | None, param: str | None = None) -> bytes:
        return data({"error": {"message": message, "type": kind, "param": param,
                               "code": code}})

    text = SentText()
    yield data(chunk(rid, model, created, {"role": "assistant", "content": ""},
                     with_usage=include_usage))
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
            delta = text.feed(event)
            if delta is None:
                yield error(RESTARTED, "server_error", "restarted")
                break
            for d in (calls.feed(delta) if calls is not None else [{"content": delta}]
                      if delta else []):
                yield data(chunk(rid, model, created, d, with_usage=include_usage,
                                 logprobs=_take_logprobs(text)))
        elif isinstance(event, FinalEvent):
            reason = finish_of(event.finish_reason)
            if calls is not None:
                for d in calls.finish(cut=reason == "length"):
                    yield data(chunk(rid, model, created, d, with_usage=include_usage))
                if calls.calls and event.tool_calls and reason == "stop":
                    reason = "tool_calls"
            yield data(chunk(rid, model, created, {}, reason, with_usage=include_usage,
                             logprobs=_take_logprobs(text)))
            if include_usage:
                yield data(chunk(rid, model, created, None, usage=usage_of(event.usage),
                                 with_usage=True))
            break
        elif isinstance(event, ErrorEvent):
            err = error_status(event)
            yield error(err.message, "server_error" if err.status >= 500
                        else "invalid_request_error", err.code, err.param)
            break
    yield b"data: [DONE]\n\n"


def _take_logprobs(text: SentText) -> dict[str, Any] | None:
    """OpenAI's chunk `logprobs` ({"content": [...]}) of the tokens not sent yet (None:
    none asked for, or none new): they go with the next chunk that carries text."""
    if not text.logprobs:
        return None
    content = [e.model_dump(mode="json") for e in text.logprobs]
    text.logprobs = []
    return {"content": content}
