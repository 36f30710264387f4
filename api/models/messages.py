"""Anthropic Messages API shapes: the bodies POST /v1/messages and /v1/messages/count_tokens
accept, and the objects they answer.

The body is checked twice, as a chat completion's is: here for its JSON shape (so the
OpenAPI document says what is accepted), then by `schemas.anthropic_batch.messages_request`
as the `params` of a Message Batches line, so a message and a batch request accept the
same parameters and give the same messages for the same mistakes (the paths without the
line's `params.`). Content blocks are read there too: text, tool_use (assistant turns),
tool_result (user turns); anything else is refused by name.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

from inflight.schemas import InferenceRequest, SchemaError
from inflight.schemas.anthropic_batch import messages_request
from inflight.schemas.anthropic_message import message_object
from inflight.schemas.params import MAX_STOP_STRINGS, MAX_TOKENS_LIMIT
from inflight.schemas.requests import MAX_MESSAGES, PRIORITY_INTERACTIVE
from inflight.schemas.settings import Settings
from inflight.schemas.tools import MAX_TOOLS

Block = dict[str, Any]


class MessageIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["user", "assistant"]
    content: str | Annotated[list[Block], Field(max_length=1024)] = Field(
        description="a string, or content blocks: text; tool_use (assistant turns); "
                    "tool_result (user turns)")


class TextBlockIn(BaseModel):
    model_config = ConfigDict(extra="allow")  # cache_control, citations: ignored
    type: Literal["text"]
    text: str


class ToolIn(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")]
    description: str | None = None
    input_schema: dict[str, Any]


class ToolChoiceIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class CountTokensRequest(BaseModel):
    """POST /v1/messages/count_tokens: the prompt part of a Messages API request."""

    model_config = ConfigDict(extra="allow")  # the rest is checked (and named) on conversion
    model: Annotated[str, Field(max_length=256)]
    messages: Annotated[list[MessageIn], Field(min_length=1, max_length=MAX_MESSAGES)]
    system: str | list[TextBlockIn] | None = None
    tools: Annotated[list[ToolIn], Field(min_length=1, max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoiceIn | None = None
    output_config: dict[str, Any] | None = None

    def to_wire(self, request_id: str, settings: Settings) -> InferenceRequest:
        """A one-token greedy request of this prompt: its usage counts the prompt's tokens
        exactly as the worker renders and tokenizes it."""
        return _to_wire(self, request_id, settings, {"max_tokens": 1, "temperature": 0.0},
                        stream=False)


class MessagesRequest(CountTokensRequest):
    """POST /v1/messages. Sampling: max_tokens (required), temperature, top_p, top_k,
    stop_sequences; tools + tool_choice (auto, any, tool, none; disable_parallel_tool_use);
    output_config.format (a JSON schema the answer must match); metadata and service_tier
    are accepted and ignored; stream for server-sent events. A parameter the service
    cannot honour (thinking, images, a prefill) is a 400 that names it."""

    max_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS_LIMIT, strict=True)]
    stop_sequences: Annotated[list[str], Field(max_length=MAX_STOP_STRINGS)] | None = None
    temperature: Annotated[float, Field(strict=True)] | None = None
    top_p: Annotated[float, Field(strict=True)] | None = None
    top_k: Annotated[int, Field(strict=True)] | None = None
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
    stream: bool | None = None

    def to_wire(self, request_id: str, settings: Settings) -> InferenceRequest:
        return _to_wire(self, request_id, settings, {}, stream=bool(self.stream))


def _to_wire(body: CountTokensRequest, request_id: str, settings: Settings,
             update: dict[str, Any], stream: bool) -> InferenceRequest:
    params = {**body.model_dump(mode="json", exclude_none=True, exclude={"stream"}), **update}
    raw = orjson.dumps(params)
    limit = settings.kafka_max_message_bytes
    if len(raw) > limit:
        raise SchemaError(f"the request is {len(raw)} bytes, over the limit of {limit} "
                          "(setting INFLIGHT_KAFKA_MAX_MESSAGE_BYTES); shorten the prompt",
                          field="messages", code="message_too_large")
    try:
        return messages_request(params, raw, request_id=request_id,
                                priority=PRIORITY_INTERACTIVE, stream=stream,
                                max_prompt_chars=settings.max_prompt_chars)
    except SchemaError as exc:  # say `max_tokens`, not `params.max_tokens`
        field = exc.field.removeprefix("params.") if exc.field else None
        raise SchemaError(exc.message.replace("params.", ""), field=field,
                          request_id=request_id, code=exc.code) from None


# --- answers ----------------------------------------------------------------------------

class AnthropicUsage(BaseModel):
    input_tokens: int
    output_tokens: int


class Message(BaseModel):
    """Anthropic's Message object (schemas/anthropic_message.py builds it)."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[Block]
    stop_reason: Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]
    stop_sequence: str | None
    usage: AnthropicUsage


class MessageTokensCount(BaseModel):
    input_tokens: int


def message(request_id: str, model: str, final: Any, tools: bool) -> dict[str, Any]:
    """The Message of a final event; `tools`: the request could call tools. Its id is
    `msg_<request id>`, so GET /v1/requests/{id} finds the request (as chatcmpl- does)."""
    return message_object(request_id, model, text=final.text, id=f"msg_{request_id}",
                          finish_reason=final.finish_reason,
                          input_tokens=final.usage.prompt_tokens,
                          output_tokens=final.usage.completion_tokens, tools=tools,
                          stop_sequence=final.stop_reason)
