"""OpenAI chat completion shapes: the request body we accept and the objects we answer.

The body is checked twice on purpose: here for its JSON shape (so the OpenAPI document
says what is accepted), then by `schemas.parse_batch_line` as the body of an OpenAI Batch
line, so a chat completion and a batch line accept exactly the same parameters and give
the same messages for the same mistakes.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

from inflight.api.models.sampling import OpenAISampling
from inflight.schemas import InferenceRequest, SchemaError, parse_batch_line
from inflight.schemas.batch import CHAT_URL
from inflight.schemas.events import Logprobs
from inflight.schemas.params import MAX_LOGPROBS, MAX_TOKENS_LIMIT
from inflight.schemas.requests import MAX_MESSAGES, PRIORITY_INTERACTIVE
from inflight.schemas.tools import MAX_TOOLS, ToolCall, ToolChoice, parse_tool_calls


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class TextMessageIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user"]
    content: str | list[TextPart]
    name: Annotated[str, Field(max_length=64)] | None = None


class AssistantMessageIn(BaseModel):
    """An earlier answer: text, and/or the tool calls it made (content null then)."""

    model_config = ConfigDict(extra="forbid")
    role: Literal["assistant"]
    content: str | list[TextPart] | None = None
    name: Annotated[str, Field(max_length=64)] | None = None
    tool_calls: Annotated[list[ToolCall], Field(max_length=128)] | None = None
    refusal: None = None


class ToolMessageIn(BaseModel):
    """The result of one of the assistant's tool calls."""

    model_config = ConfigDict(extra="forbid")
    role: Literal["tool"]
    content: str | list[TextPart]
    tool_call_id: Annotated[str, Field(max_length=128)]


ChatMessageIn = Annotated[TextMessageIn | AssistantMessageIn | ToolMessageIn,
                          Field(discriminator="role")]


class FunctionIn(BaseModel):
    """A tool's function; its `parameters` schema is compiled when the body becomes a
    request (a schema the grammar engine refuses is a 400 with code invalid_schema)."""

    model_config = ConfigDict(extra="forbid")
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")]
    description: Annotated[str, Field(max_length=8192)] | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: FunctionIn


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]


class JsonObjectFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["json_object"]


class JsonSchemaSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: Annotated[str, Field(min_length=1, max_length=64)]
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")]


class ChatCompletionRequest(OpenAISampling):
    """POST /v1/chat/completions. Sampling: max_tokens (or max_completion_tokens),
    temperature, top_p, seed, stop, logprobs + top_logprobs (streamed: per chunk), and vLLM's
    top_k, stop_token_ids, ignore_eos. Output constraints: response_format (text,
    json_object, json_schema), tools + tool_choice (none, auto, required, a named function)
    + parallel_tool_calls, and vLLM's structured_outputs (json, json_object, regex,
    choice, grammar, structural_tag). Penalties, logit_bias and vLLM's other sampling
    controls, and n (above 1 without stream): api/models/sampling.py, the fields text completions share."""

    messages: Annotated[list[ChatMessageIn], Field(min_length=1, max_length=MAX_MESSAGES)]
    model: Annotated[str, Field(max_length=256)] | None = None
    max_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS_LIMIT, strict=True)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS_LIMIT, strict=True)] | None = None
    logprobs: Annotated[bool, Field(strict=True)] | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS, strict=True)] | None = None
    response_format: ResponseFormat | None = None
    tools: Annotated[list[ToolIn], Field(min_length=1, max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    structured_outputs: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None

    def to_wire(self, request_id: str, max_prompt_chars: int, max_bytes: int) -> InferenceRequest:
        if self.top_logprobs and not self.logprobs:
            raise SchemaError("top_logprobs needs logprobs: true", field="top_logprobs")
        self.check_n()
        body = self.model_dump(mode="json", exclude_none=True, by_alias=True,
                               exclude={"stream", "stream_options", "logprobs", "top_logprobs", "n"})
        line = orjson.dumps({"custom_id": request_id, "method": "POST", "url": CHAT_URL,
                             "body": body})
        try:
            req = parse_batch_line(line, max_bytes=max_bytes, max_prompt_chars=max_prompt_chars)
        except SchemaError as exc:  # say `temperature`, not `body.temperature`
            field = exc.field.removeprefix("body.") if exc.field else None
            raise SchemaError(exc.message.replace("body.", ""), field=field,
                              request_id=request_id, code=exc.code) from None
        update: dict[str, Any] = {"priority": PRIORITY_INTERACTIVE, "stream": bool(self.stream)}
        if self.logprobs:
            update["params"] = dataclasses.replace(req.params, logprobs=self.top_logprobs or 0)
        return req.model_copy(update=update)


# --- answers ----------------------------------------------------------------------------

class ChatUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: None = None
    tool_calls: list[ToolCall] | None = None


class Choice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: Literal["stop", "length", "tool_calls"]
    logprobs: Logprobs | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: ChatUsage


def usage_of(usage: Any) -> dict[str, int]:
    p, c = usage.prompt_tokens, usage.completion_tokens
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def finish_of(reason: str) -> str:
    return "length" if reason == "length" else "stop"


def completion(request_id: str, model: str, final: Any, tools: bool = False) -> dict[str, Any]:
    """The chat.completion of a final event; `tools`: the request could call tools."""
    message: dict[str, Any] = {"role": "assistant", "content": final.text, "refusal": None}
    finish = finish_of(final.finish_reason)
    if tools or final.tool_calls:  # the text outside the calls (None when empty), no
        # markup of a call cut by max_tokens (schemas.tools.parse_tool_calls)
        message["content"] = parse_tool_calls(final.text, request_id, cut=finish == "length")[0]
    if final.tool_calls:
        message["tool_calls"] = [c.model_dump(mode="json") for c in final.tool_calls]
        finish = "tool_calls" if finish == "stop" else finish  # cut short: "length"
    return {"id": f"chatcmpl-{request_id}", "object": "chat.completion",
            "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": message,
                         "finish_reason": finish,
                         "logprobs": (final.logprobs.model_dump(mode="json")
                                      if final.logprobs is not None else None)}],
            "usage": usage_of(final.usage)}


def chunk(request_id: str, model: str, created: int, delta: dict[str, Any],
          finish_reason: str | None = None, usage: dict[str, int] | None = None,
          with_usage: bool = False, logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": f"chatcmpl-{request_id}", "object": "chat.completion.chunk", "created": created,
        "model": model,
        "choices": [] if delta is None else [{"index": 0, "delta": delta, "logprobs": logprobs,
                                              "finish_reason": finish_reason}]}
    if with_usage:
        body["usage"] = usage
    return body
