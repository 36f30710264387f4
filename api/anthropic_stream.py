"""A streamed Messages API answer: the request's events as Anthropic's server-sent events.

    event: message_start        the message, content [] (at once: the request was accepted)
    event: ping                 every INFLIGHT_API_KEEPALIVE_S without an event
    event: content_block_start  {"type": "text", "text": ""} | {"type": "tool_use", "id",
                                "name", "input": {}}
    event: content_block_delta  text_delta {"text"} | input_json_delta {"partial_json"}
    event: content_block_stop
    event: message_delta        {"stop_reason", "stop_sequence"}, usage (input and output
                                tokens: the prompt's count is known only at the end)
    event: message_stop
    event: error                {"type": "error", "error": {"type", "message"}}: the stream ends

Text deltas of a request with tools go through schemas.tool_stream.ToolCallStream (the
reader chat completions use), whose OpenAI-shaped deltas become blocks here: content is a
text block, a call a tool_use block whose input streams as JSON pieces. A redo on another
worker is sent only past what was already sent (api/follow.SentText).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson

from inflight.api.context import ApiContext
from inflight.api.errors import ANTHROPIC_PREFIX, APIError, error_body
from inflight.api.follow import RESTARTED, SentText, error_status, timeout_error
from inflight.api.sse import sse
from inflight.api.streams import ApiStream
from inflight.producers import RequestNotFound
from inflight.schemas import ErrorEvent, FinalEvent, TokenEvent
from inflight.schemas.anthropic_message import stop_reason
from inflight.schemas.anthropic_tools import tool_use_id
from inflight.schemas.tool_stream import ToolCallStream

PING = sse("ping", b'{"type":"ping"}')


def event(name: str, body: dict[str, Any]) -> bytes:
    return sse(name, orjson.dumps({"type": name, **body}))


class Blocks:
    """OpenAI-shaped deltas ({"content"} or {"tool_calls"}) as content-block events."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None   # the open block's type

    def feed(self, delta: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        if delta.get("content"):
            if self.open != "text":
                out += self.start({"type": "text", "text": ""})
            out.append(event("content_block_delta", {"index": self.index, "delta": {
                "type": "text_delta", "text": delta["content"]}}))
        for call in delta.get("tool_calls", ()):
            fn = call["function"]
            if "id" in call:
                out += self.start({"type": "tool_use", "id": tool_use_id(call["id"]),
                                    "name": fn["name"], "input": {}})
            if fn.get("arguments"):
                out.append(event("content_block_delta", {"index": self.index, "delta": {
                    "type": "input_json_delta", "partial_json": fn["arguments"]}}))
        return out

    def close(self) -> list[bytes]:
        if self.open is None:
            return []
        self.open = None
        return [event("content_block_stop", {"index": self.index})]

    def start(self, block: dict[str, Any]) -> list[bytes]:
        out = self.close()
        self.index += 1
        self.open = block["type"]
        out.append(event("content_block_start", {"index": self.index, "content_block": block}))
        return out


def _error(err: APIError) -> bytes:
    return sse("error", orjson.dumps(error_body(ANTHROPIC_PREFIX, err.status, err.message)))


async def message_events(ctx: ApiContext, rid: str, model: str, stream: ApiStream,
                         calls: ToolCallStream | None) -> AsyncIterator[bytes]:
    """`calls`: the request has tools it may call (module doc)."""
    yield event("message_start", {"message": {
        "id": f"msg_{rid}", "type": "message", "role": "assistant", "model": model,
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 0, "output_tokens": 0}}})
    blocks, text = Blocks(), SentText()
    while True:
        try:
            ev = await stream.next_or_idle()
        except RequestNotFound as exc:
            yield _error(timeout_error(ctx, exc))
            return
        if ev is None:
            yield PING
        elif isinstance(ev, TokenEvent):
            delta = text.feed(ev)
            if delta is None:
                yield _error(APIError(500, RESTARTED, code="restarted"))
                return
            for d in (calls.feed(delta) if calls is not None else
                      [{"content": delta}] if delta else []):
                for frame in blocks.feed(d):
                    yield frame
        elif isinstance(ev, FinalEvent):
            for frame in _ending(ev, blocks, calls):
                yield frame
            return
        elif isinstance(ev, ErrorEvent):
            yield _error(error_status(ev))
            return


def _ending(final: FinalEvent, blocks: Blocks, calls: ToolCallStream | None) -> list[bytes]:
    """The last blocks, message_delta and message_stop of a finished request."""
    cut = final.finish_reason == "length"
    out: list[bytes] = []
    if calls is not None:
        for d in calls.finish(cut=cut):
            out += blocks.feed(d)
    elif blocks.index < 0:  # no text at all: the empty text block a whole answer has
        out += blocks.start({"type": "text", "text": ""})
    out += blocks.close()
    called = calls is not None and calls.calls > 0
    stop = None if cut or called else final.stop_reason
    out.append(event("message_delta", {
        "delta": {"stop_reason": stop_reason(final.finish_reason, called=called,
                                             stop_sequence=stop),
                  "stop_sequence": stop},
        "usage": {"input_tokens": final.usage.prompt_tokens,
                  "output_tokens": final.usage.completion_tokens}}))
    out.append(event("message_stop", {}))
    return out
