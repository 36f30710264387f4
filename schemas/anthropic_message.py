"""A Messages API answer (the `message` object) from a finished request: the one builder
POST /v1/messages and the Message Batches results share.

    {"id": "msg_…", "type": "message", "role": "assistant", "model": M,
     "content": [{"type": "text", "text": …}, {"type": "tool_use", "id": "toolu_…",
                  "name": …, "input": {…}}],
     "stop_reason": "end_turn" | "max_tokens" | "stop_sequence" | "tool_use",
     "stop_sequence": the stop sequence that ended it (else null),
     "usage": {"input_tokens": …, "output_tokens": …}}

A request with tools answers its calls as `tool_use` blocks and the text outside them as
one text block (none when empty); a call the answer did not finish (max_tokens) is
dropped, with no markup left in the text (schemas.tools.parse_tool_calls). Without tools
the content is one text block, empty or not.
"""

from __future__ import annotations

import hashlib
from typing import Any

from inflight.schemas.anthropic_tools import tool_use_blocks
from inflight.schemas.tools import parse_tool_calls


def message_id(request_id: str) -> str:
    """A batch request's message id (its request id holds the batch's and the custom id)."""
    return "msg_" + hashlib.sha256(request_id.encode()).hexdigest()[:24]


def stop_reason(finish_reason: str | None, *, called: bool, stop_sequence: str | None) -> str:
    """Anthropic's stop_reason for the engine's finish reason ("stop" | "length")."""
    if finish_reason == "length":
        return "max_tokens"
    if called:
        return "tool_use"
    return "stop_sequence" if stop_sequence is not None else "end_turn"


def content_blocks(text: str, request_id: str, *, tools: bool,
                   cut: bool) -> list[dict[str, Any]]:
    """The answer's content blocks; `tools`: the request had tools it could call,
    `cut`: the answer ended at max_tokens."""
    if not tools:
        return [{"type": "text", "text": text}]
    content, calls = parse_tool_calls(text, request_id, cut=cut)
    return ([{"type": "text", "text": content}] if content else []) + tool_use_blocks(calls)


def message_object(request_id: str, model: str, *, text: str, finish_reason: str | None,
                   input_tokens: int, output_tokens: int, tools: bool,
                   stop_sequence: str | None = None, id: str | None = None) -> dict[str, Any]:
    """`id`: the message's id (default: message_id(request_id))."""
    cut = finish_reason == "length"
    content = content_blocks(text, request_id, tools=tools, cut=cut)
    called = any(b["type"] == "tool_use" for b in content)
    stop = None if cut or called else stop_sequence
    return {"id": id or message_id(request_id), "type": "message", "role": "assistant",
            "model": model, "content": content,
            "stop_reason": stop_reason(finish_reason, called=called, stop_sequence=stop),
            "stop_sequence": stop,
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens}}
