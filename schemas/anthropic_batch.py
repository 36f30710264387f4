"""Anthropic Message Batches lines: `{"custom_id": ..., "params": {Messages API request}}`.

    {"custom_id": "q1", "params": {"model": "...", "max_tokens": 64,
     "system": "Be brief.", "messages": [{"role": "user", "content": "Hi"}],
     "temperature": 0.2, "stop_sequences": ["\\n\\n"]}}

`params` maps onto an InferenceRequest: `system` (a string or text blocks) becomes a
leading system message, content blocks are text (plus `tool_use` in assistant turns and
`tool_result` in user turns), `stop_sequences` -> stop, `max_tokens` is required (as in the
Messages API). `tools` ({name, description, input_schema}) and `tool_choice` ({"type":
"auto" | "any" | "tool" | "none", "name", "disable_parallel_tool_use"}) become OpenAI-style
tools (schemas.tools: auto, required, a named function, none); the result then answers
with `tool_use` blocks. `output_config: {"format": {"type": "json_schema", "schema": S}}`
(Anthropic's structured outputs; the beta's `output_format` is the same `format`)
constrains the answer to S (structured_outputs json).
Parameters we cannot honour (thinking, images, an assistant turn last -- a prefill the
chat template cannot continue -- ...) are rejected by name; `model`, `metadata`,
`service_tier` and `stream: false` are ignored.

`messages_request` converts the params alone: POST /v1/messages uses it too, so a Message
Batches line and a Messages API call accept the same parameters with the same messages.
"""

from __future__ import annotations

from typing import Any

from inflight.schemas.anthropic_tools import tool_fields, turns
from inflight.schemas.codec import DEFAULT_MAX_PROMPT_CHARS, renamed_field, request_from_object
from inflight.schemas.errors import SchemaError
from inflight.schemas.requests import PRIORITY_BATCH, InferenceRequest

MESSAGES_URL = "/v1/messages"

_PARAM_MAP = {"max_tokens": "max_tokens", "temperature": "temperature", "top_p": "top_p",
              "top_k": "top_k", "stop_sequences": "stop"}
_IGNORED = {"model", "metadata", "service_tier"}
_FIELD_PATHS = (("params.stop", "params.stop_sequences"), ("messages", "params.messages"),
                ("tools.", "params.tools."), ("tool_choice", "params.tool_choice"),
                ("params.structured_outputs.json", "params.output_config.format.schema"),
                ("params.structured_outputs", "params.output_config.format"),
                ("params.", "params."))


def _fail(msg: str, raw: bytes, field: str | None, rid: str) -> SchemaError:
    return SchemaError(msg, raw=raw, field=field, request_id=rid)


def _text(content: Any, where: str, raw: bytes, rid: str) -> str:
    """A string, or a list of {"type": "text", "text": ...} blocks, as one string."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for i, block in enumerate(content):
            if not (isinstance(block, dict) and block.get("type") == "text"
                    and isinstance(block.get("text"), str)):
                raise _fail(f"{where}.{i}: only text blocks are supported here (type 'text' "
                            "with a 'text' string)", raw, f"{where}.{i}", rid)
            texts.append(block["text"])
        return "".join(texts)
    raise _fail(f"{where}: give a string or a list of text blocks (got {type(content).__name__})",
                raw, where, rid)


def anthropic_batch_request(obj: dict[str, Any], raw: bytes, *, request_id: str,
                            batch_id: str | None = None, priority: int = PRIORITY_BATCH,
                            stream: bool | None = False,
                            max_prompt_chars: int | None = DEFAULT_MAX_PROMPT_CHARS
                            ) -> InferenceRequest:
    """One loaded Message Batches line → InferenceRequest with the given request_id.
    Raises only SchemaError, with the line's own field paths (params.max_tokens, ...)."""
    extra = sorted(set(obj) - {"custom_id", "params"})
    if extra:
        raise _fail(f"unknown field(s) {', '.join(map(repr, extra))} in a Message Batches "
                    "line: remove them; allowed: custom_id, params", raw, extra[0], request_id)
    return messages_request(obj.get("params"), raw, request_id=request_id, batch_id=batch_id,
                            priority=priority, stream=stream, max_prompt_chars=max_prompt_chars)


def messages_request(params: Any, raw: bytes, *, request_id: str, batch_id: str | None = None,
                     priority: int = PRIORITY_BATCH, stream: bool | None = False,
                     max_prompt_chars: int | None = DEFAULT_MAX_PROMPT_CHARS
                     ) -> InferenceRequest:
    """A Messages API request body (a line's `params`) → InferenceRequest. Raises only
    SchemaError, its fields under `params.` (a caller whose client wrote the body itself
    drops that prefix)."""
    if not isinstance(params, dict):
        raise _fail(f"params: must be a JSON object (got {type(params).__name__})", raw,
                    "params", request_id)
    sampling: dict[str, Any] = {}
    unknown = []
    for key, value in params.items():
        if key in _PARAM_MAP:
            sampling[_PARAM_MAP[key]] = value
        elif key in _IGNORED or key in ("messages", "system", "tools", "tool_choice"):
            continue
        elif key == "output_config":
            sampling.update(_output_config(value, raw, request_id))
        elif key == "output_format":  # the structured-outputs beta's spelling
            sampling.update(_output_config({"format": value}, raw, request_id))
        elif key == "stream":
            if value not in (None, False):
                raise _fail("params.stream: batch requests do not stream; remove it", raw,
                            "params.stream", request_id)
        else:
            unknown.append(key)
    if unknown:
        raise _fail(f"params: unsupported parameter(s) {', '.join(map(repr, sorted(unknown)))}; "
                    "remove them (supported: messages, system, tools, tool_choice, "
                    "output_config, " + ", ".join(_PARAM_MAP) + ")",
                    raw, f"params.{sorted(unknown)[0]}", request_id)
    if "max_tokens" not in params:
        raise _fail("missing required field 'params.max_tokens'", raw, "params.max_tokens",
                    request_id)
    fields = {"request_id": request_id, "messages": _messages(params, raw, request_id),
              "params": sampling, "batch_id": batch_id, "priority": priority, "stream": stream}
    fields.update(tool_fields(params, raw, request_id))
    try:
        return request_from_object(fields, raw=raw, max_prompt_chars=max_prompt_chars)
    except SchemaError as e:
        raise renamed_field(e, _FIELD_PATHS) from None


def _messages(params: dict[str, Any], raw: bytes, rid: str) -> list[dict[str, Any]]:
    """`system` and the turns as chat messages."""
    msgs = params.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise _fail("params.messages: give a non-empty list of {role, content} turns", raw,
                    "params.messages", rid)
    messages = []
    if "system" in params and params["system"] is not None:
        messages.append({"role": "system",
                         "content": _text(params["system"], "params.system", raw, rid)})
    for i, m in enumerate(msgs):
        where = f"params.messages.{i}"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise _fail(f"{where}: each turn is {{\"role\": \"user\" | \"assistant\", "
                        "\"content\": ...}", raw, where, rid)
        if set(m) - {"role", "content"}:
            bad = sorted(set(m) - {"role", "content"})[0]
            raise _fail(f"{where}.{bad}: unknown field; remove it", raw, f"{where}.{bad}", rid)
        messages.extend(turns(m["role"], m.get("content"), f"{where}.content", raw, rid))
    if msgs[-1].get("role") == "assistant":
        # NOTE: the chat template ends the turn and opens a new one; continuing the text
        # (what a prefill means) would need a template mode the engine does not have
        where = f"params.messages.{len(msgs) - 1}"
        raise _fail(f"{where}: the last turn is the assistant's (a prefill to continue); "
                    "that is not supported: end with a user turn", raw, where, rid)
    return messages


def _output_config(value: Any, raw: bytes, rid: str) -> dict[str, Any]:
    """`output_config` as sampling fields: its `format` (a JSON schema) constrains the
    answer; `effort` has no meaning here."""
    where = "params.output_config"
    if value is None:
        return {}
    if not isinstance(value, dict) or set(value) - {"format"}:
        bad = sorted(set(value) - {"format"})[0] if isinstance(value, dict) else None
        raise _fail(f"{where}: only `format` is supported"
                    + (f" (remove {bad!r})" if bad else ""), raw,
                    f"{where}.{bad}" if bad else where, rid)
    fmt = value.get("format")
    if fmt is None:
        return {}
    if not (isinstance(fmt, dict) and fmt.get("type") == "json_schema"
            and isinstance(fmt.get("schema"), dict) and set(fmt) <= {"type", "schema"}):
        raise _fail(f"{where}.format: give {{\"type\": \"json_schema\", \"schema\": {{...}}}}",
                    raw, f"{where}.format", rid)
    return {"structured_outputs": {"json": fmt["schema"]}}
