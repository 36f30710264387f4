"""Tool calls: OpenAI's `tools` + `tool_choice` on a request, the constraint that makes the
model's answer a call, and the calls read back out of the answer.

How a model calls a tool (Hermes' convention, which Qwen2.5, SmolLM3 and Hermes models are
trained on): the tools are rendered into the prompt (by the model's chat template when it
takes `tools`, else a system message of ours, `tools_system_prompt`), and a call is

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

`tool_choice` picks the constraint (a structural tag, engine/structured_outputs.py):
- "none": tools are neither rendered nor callable; the answer is text;
- "auto" (the default with tools): free text; once the model writes `<tool_call>`, the
  rest of the call is constrained: one of the tools' names and JSON arguments matching that
  tool's `parameters` schema. The model decides whether to call;
- "required": the answer is one or more calls (no text);
- {"type": "function", "function": {"name": N}}: exactly one call, to N.
`parallel_tool_calls: false` allows at most one call. The calls are read back by
`parse_tool_calls` (the worker puts them on the final event) and, while streaming, by
`schemas.tool_stream.ToolCallStream`; a call's id is derived from the request id and its
position, so every reader names it the same.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, JsonValue, field_validator

from inflight.schemas.base import FiniteJson, WireModel
from inflight.schemas.params import StructuredOutputs, StructuredOutputsError

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
MAX_TOOLS = 128
ToolName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")]
EMPTY_PARAMETERS = {"type": "object", "properties": {}}


class FunctionDef(WireModel):
    name: ToolName
    description: Annotated[str, Field(max_length=8192)] | None = None
    parameters: Annotated[dict[str, JsonValue], FiniteJson] | None = None
    strict: bool | None = None  # every call is constrained to the schema anyway

    @field_validator("parameters")
    @classmethod
    def _compiles(cls, value: dict | None) -> dict | None:
        if value is not None:
            try:
                StructuredOutputs(json=value)
            except StructuredOutputsError as exc:
                raise StructuredOutputsError(f"the JSON schema {str(exc)}", None, exc.code) from None
        return value


class Tool(WireModel):
    type: Literal["function"] = "function"
    function: FunctionDef


class FunctionName(WireModel):
    name: ToolName


class NamedToolChoice(WireModel):
    type: Literal["function"] = "function"
    function: FunctionName


def _choice(value: Any) -> Any:
    if isinstance(value, str) and value not in ("none", "auto", "required"):
        raise ValueError(f"use 'none', 'auto', 'required' or {{\"type\": \"function\", "
                         f"\"function\": {{\"name\": ...}}}} (got {value!r:.40})")
    return value


ToolChoice = Annotated[Literal["none", "auto", "required"] | NamedToolChoice, BeforeValidator(_choice)]


class FunctionCall(WireModel):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(WireModel):
    """One call in OpenAI's shape (`message.tool_calls[i]`)."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


def tool_call_id(request_id: str, index: int) -> str:
    return "call_" + hashlib.sha256(f"{request_id}/{index}".encode()).hexdigest()[:24]


def call_begin(name: str) -> str:
    return f'{CALL_OPEN}\n{{"name": {json.dumps(name)}, "arguments": '


CALL_END = "}\n" + CALL_CLOSE


def choice_name(choice: Any) -> str | None:
    """The function a named tool_choice asks for (a model or its dict form)."""
    if isinstance(choice, NamedToolChoice):
        return choice.function.name
    if isinstance(choice, dict):
        fn = choice.get("function")
        return fn.get("name") if isinstance(fn, dict) else None
    return None


def tool_constraint(tools: list[Any], choice: Any, parallel: bool | None = True) -> dict | None:
    """`structured_outputs` for these tools and tool_choice (None for "none"). `tools`:
    Tool models or their dict form."""
    if choice == "none" or not tools:
        return None
    named = choice_name(choice)
    if choice not in ("auto", "required") and named is None:
        raise ValueError(f"tool_choice {choice!r:.40} is not one of ours")
    structures = []
    for t in tools:
        fn = t.function if isinstance(t, Tool) else FunctionDef.model_validate(t["function"])
        if named is None or fn.name == named:
            structures.append({"begin": call_begin(fn.name), "end": CALL_END,
                               "schema": fn.parameters or EMPTY_PARAMETERS})
    if not structures:
        raise ValueError(f"tool_choice names {named!r}, which is not among the tools")
    return {"structural_tag": {"structures": structures, "triggers": [CALL_OPEN],
                               "at_least_one": choice != "auto",
                               "stop_after_first": named is not None or parallel is False}}


_CALL = re.compile(re.escape(CALL_OPEN) + r"\s*")
_ARGS_KEY = re.compile(r'"arguments"\s*:\s*')
_DECODER = json.JSONDecoder()


def parse_tool_calls(text: str, request_id: str, *,
                     cut: bool = False) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, calls) of an answer to a request with tools: the text outside the
    `<tool_call>` blocks, and each well-formed call in OpenAI's shape (`arguments` is the
    JSON text the model wrote). A complete block (closing tag and all) that does not parse
    stays in the content.

    NOTE (no markup in the content): a call the answer did not finish -- a `<tool_call>`
    without its closing tag that does not parse, at the end -- is dropped, and a call
    whose closing tag was cut (`</tool_`) still counts. With `cut` (the answer ended at
    max_tokens), a tail that could begin `<tool_call>` (`<tool_`) is dropped too, as the
    streamed reader (schemas.tool_stream) holds it back. Content is None when it is empty
    and something was taken out of it."""
    calls: list[dict[str, Any]] = []
    content: list[str] = []
    pos, end = 0, len(text)
    for m in _CALL.finditer(text):
        if m.start() < pos:
            continue
        call = _read_call(text, m.end())
        if call is None:
            if text.find(CALL_CLOSE, m.end()) < 0:  # unfinished: it runs to the end
                end = m.start()
                break
            continue
        name, args, block_end = call
        content.append(text[pos:m.start()])
        calls.append({"id": tool_call_id(request_id, len(calls)), "type": "function",
                      "function": {"name": name, "arguments": args}})
        pos = block_end
    if cut and end == len(text):
        end -= partial_tail(text[pos:], CALL_OPEN)
    if not calls and end == len(text):
        return text, []
    content.append(text[pos:end])
    rest = "".join(content)
    rest = rest.strip() if calls else rest.rstrip()
    return rest or None, calls


def partial_tail(text: str, marker: str) -> int:
    """Length of the longest tail of `text` that is a proper prefix of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def _read_call(text: str, at: int) -> tuple[str, str, int] | None:
    """(name, arguments text, end of the block) of the call JSON starting at `at`."""
    try:
        obj, end = _DECODER.raw_decode(text, at)
    except ValueError:
        return None
    if not (isinstance(obj, dict) and isinstance(obj.get("name"), str)):
        return None
    args = "{}"
    key = _ARGS_KEY.search(text, at, end)
    if "arguments" in obj and key is not None:
        try:
            _, a_end = _DECODER.raw_decode(text, key.end())
            args = text[key.end():a_end]
        except ValueError:
            return None
    close = text.find(CALL_CLOSE, end)
    if close >= 0 and not text[end:close].strip():
        return obj["name"], args, close + len(CALL_CLOSE)
    rest = text[end:].lstrip()
    if rest and CALL_CLOSE.startswith(rest):  # the closing tag was cut short
        return obj["name"], args, len(text)
    return obj["name"], args, end  # no closing tag: the call still counts


def tools_system_prompt(tools: list[dict[str, Any]]) -> str:
    """The tools as a system message (Hermes' wording, shortened), for a chat template that
    does not render tools."""
    listed = "\n".join(json.dumps(t.get("function", t), ensure_ascii=False, separators=(",", ":"))
                       for t in tools)
    return (f"Functions you may call:\n<tools>\n{listed}\n</tools>\nTo call one: {CALL_OPEN}\n"
            '{"name": <name>, "arguments": <object>}\n' + CALL_CLOSE)


def render_tool_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                         template_takes_tools: bool) -> list[dict[str, Any]]:
    """Chat messages as a chat template without tool support reads them: assistant tool
    calls written out as `<tool_call>` blocks, tool results as `<tool_response>` user turns,
    the tools in the system message. A template that takes tools gets the messages as
    they are (with each call's arguments as an object, as Hugging Face templates expect)."""
    out = []
    for m in messages:
        m = dict(m)
        calls = m.pop("tool_calls", None)
        if template_takes_tools:
            if calls:
                m["tool_calls"] = [{"type": "function", "id": c.get("id"), "function": {
                    "name": c["function"]["name"],
                    "arguments": _loads(c["function"]["arguments"])}} for c in calls]
            out.append(m)
            continue
        m.pop("tool_call_id", None)
        if m["role"] == "tool":
            m = {"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"}
        elif calls:
            blocks = [f"{CALL_OPEN}\n" + json.dumps({"name": c["function"]["name"],
                                                     "arguments": _loads(c["function"]["arguments"])},
                                                    ensure_ascii=False) + f"\n{CALL_CLOSE}"
                      for c in calls]
            m["content"] = "\n".join(([m["content"]] if m.get("content") else []) + blocks)
        out.append(m)
    if tools and not template_takes_tools:
        prompt = tools_system_prompt(tools)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + prompt}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


def _loads(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


MAX_TOOLS_FIELD = Annotated[list[Tool], Field(min_length=1, max_length=MAX_TOOLS)]
