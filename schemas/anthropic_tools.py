"""Anthropic's tool use on a Message Batches line, as the OpenAI-style tools of an
InferenceRequest (schemas.tools), and the answer's calls as `tool_use` blocks.

    tools:       [{"name", "description", "input_schema"}]  -> [{"type": "function", "function":
                                                               {"name", "description", "parameters"}}]
    tool_choice: {"type": "auto"}  -> "auto"     {"type": "any"} -> "required"
                 {"type": "tool", "name": N} -> that function    {"type": "none"} -> "none"
                 "disable_parallel_tool_use": true -> at most one call
    turns:       assistant `tool_use` blocks -> the turn's tool_calls; user `tool_result`
                 blocks -> "tool" turns (their text is the result)
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from inflight.schemas.errors import SchemaError

_CHOICES = {"auto": "auto", "any": "required", "none": "none"}


def _fail(msg: str, raw: bytes, field: str, rid: str) -> SchemaError:
    return SchemaError(msg, raw=raw, field=field, request_id=rid)


def tool_fields(params: dict[str, Any], raw: bytes, rid: str) -> dict[str, Any]:
    """InferenceRequest's tools / tool_choice / parallel_tool_calls from a line's params."""
    tools, choice = params.get("tools"), params.get("tool_choice")
    if tools is None:
        if choice is not None:
            raise _fail("params.tool_choice: needs tools", raw, "params.tool_choice", rid)
        return {}
    if not isinstance(tools, list) or not tools:
        raise _fail("params.tools: give a non-empty list of {name, description, input_schema}",
                    raw, "params.tools", rid)
    out = []
    for i, t in enumerate(tools):
        where = f"params.tools.{i}"
        if not isinstance(t, dict) or t.get("type", "custom") != "custom" or \
                set(t) - {"type", "name", "description", "input_schema", "cache_control"}:
            raise _fail(f"{where}: give a client tool {{name, description, input_schema}}",
                        raw, where, rid)
        fn = {"name": t.get("name"), "parameters": t.get("input_schema")}
        if t.get("description") is not None:
            fn["description"] = t["description"]
        out.append({"type": "function", "function": fn})
    fields: dict[str, Any] = {"tools": out}
    if choice is not None:
        if not isinstance(choice, dict) or choice.get("type") not in (*_CHOICES, "tool"):
            raise _fail("params.tool_choice: give {\"type\": \"auto\" | \"any\" | \"tool\" | "
                        "\"none\"}", raw, "params.tool_choice", rid)
        kind = choice["type"]
        fields["tool_choice"] = (_CHOICES[kind] if kind != "tool" else
                                 {"type": "function", "function": {"name": choice.get("name")}})
        if choice.get("disable_parallel_tool_use"):
            fields["parallel_tool_calls"] = False
    return fields


def turns(role: str, content: Any, where: str, raw: bytes, rid: str) -> list[dict[str, Any]]:
    """One Messages API turn as chat messages (a user turn of tool results becomes a "tool"
    turn per result, then the rest of its text)."""
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise _fail(f"{where}: give a string or a list of content blocks (got "
                    f"{type(content).__name__})", raw, where, rid)
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for i, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        at = f"{where}.{i}"
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use" and role == "assistant" and isinstance(block.get("name"), str):
            calls.append({"id": str(block.get("id") or f"toolu_{i}"), "type": "function",
                          "function": {"name": block["name"],
                                       "arguments": json.dumps(block.get("input") or {})}})
        elif kind == "tool_result" and role == "user":
            results.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id") or ""),
                            "content": _result_text(block.get("content"), at, raw, rid)})
        else:
            raise _fail(f"{at}: only text blocks are supported here (and tool_use in assistant "
                        "turns, tool_result in user turns)", raw, at, rid)
    turn: dict[str, Any] = {"role": role, "content": "".join(texts)}
    if calls:
        turn["tool_calls"] = calls
    return results + ([turn] if texts or calls or not results else [])


def _result_text(content: Any, where: str, raw: bytes, rid: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(b, dict) and b.get("type") == "text"
                                         and isinstance(b.get("text"), str) for b in content):
        return "".join(b["text"] for b in content)
    raise _fail(f"{where}.content: a tool result is text (a string or text blocks)", raw,
                f"{where}.content", rid)


def tool_use_id(call_id: str) -> str:
    """The Messages API id of a call (OpenAI's `call_...` id, hashed: every reader of the
    answer names it the same)."""
    return "toolu_" + hashlib.sha256(call_id.encode()).hexdigest()[:24]


def tool_use_blocks(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An answer's calls (OpenAI's shape) as Messages API `tool_use` content blocks."""
    out = []
    for c in calls:
        try:
            args = json.loads(c["function"]["arguments"])
        except ValueError:
            args = {}
        out.append({"type": "tool_use", "id": tool_use_id(c["id"]),
                    "name": c["function"]["name"], "input": args})
    return out
