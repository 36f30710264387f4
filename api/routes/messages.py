"""Anthropic's Messages API through the queue, so the `anthropic` SDK (and what is built on
it) works unchanged:

    POST /v1/messages                {model, max_tokens, messages, system, tools, ...}
    POST /v1/messages/count_tokens   {model, messages, system, tools, ...} -> {input_tokens}

A message is filed and published like a chat completion (interactive priority) and
answered from its events (api/follow.py): the Message once the final event arrives, or
with `stream: true` Anthropic's event stream (api/anthropic_stream.py), `message_start` at
once and a `ping` every INFLIGHT_API_KEEPALIVE_S while the request waits. The body is
converted as a Message Batches line's params are (schemas/anthropic_batch.py). The
`x-api-key` header carries the key (api/deps.py); `anthropic-version` and
`anthropic-beta` are accepted as the SDK sends them. Errors use Anthropic's shape
(api/errors.py).

count_tokens runs the prompt as a one-token greedy request: the count is the worker's own
(its chat template, its tool rendering, its tokenizer), at the cost of one prefill in the
queue (which leaves the prompt in the prefix cache for the request that follows).
"""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter

from inflight.api.deps import Caller, Ctx
from inflight.api.follow import answer_when_final, cancel_quietly, submit
from inflight.api.models.errors import ANTHROPIC_ERRORS, ANTHROPIC_WAIT_ERRORS
from inflight.api.models.messages import (CountTokensRequest, Message, MessagesRequest,
                                          MessageTokensCount, message)
from inflight.api.anthropic_stream import message_events
from inflight.api.routing import ApiRoute
from inflight.api.streams import StreamResponse
from inflight.schemas.tool_stream import ToolCallStream

router = APIRouter(route_class=ApiRoute, tags=["anthropic"], responses=ANTHROPIC_ERRORS)
PATH = "/v1/messages"


@router.post(PATH, response_model=Message,
             responses={200: {"content": {"text/event-stream": {}},
                              "description": "with stream=true: Anthropic's message events"},
                        **ANTHROPIC_WAIT_ERRORS},
             summary="Anthropic-compatible message (through the queue)")
async def create_message(body: MessagesRequest, ctx: Ctx, caller: Caller) -> Any:
    model = ctx.models.resolve(body.model).id
    rid = uuid.uuid4().hex
    req = body.to_wire(rid, ctx.settings)
    tools = req.tools is not None and req.tool_choice != "none"
    stream = await submit(ctx, req, caller.owner, "messages")
    if not body.stream:
        return await answer_when_final(ctx, stream,
                                       lambda final: message(rid, model, final, tools), PATH)
    calls = ToolCallStream(rid) if tools else None
    return StreamResponse(message_events(ctx, rid, model, stream, calls), stream,
                          on_unfinished=lambda: cancel_quietly(ctx, rid))


@router.post(PATH + "/count_tokens", response_model=MessageTokensCount,
             responses=ANTHROPIC_WAIT_ERRORS,
             summary="Count a message's input tokens (a one-token request through the queue)")
async def count_tokens(body: CountTokensRequest, ctx: Ctx, caller: Caller) -> Any:
    ctx.models.resolve(body.model)
    rid = uuid.uuid4().hex
    req = body.to_wire(rid, ctx.settings)
    stream = await submit(ctx, req, caller.owner, "token_counts")
    return await answer_when_final(
        ctx, stream, lambda final: {"input_tokens": final.usage.prompt_tokens}, PATH)
