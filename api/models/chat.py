"""OpenAI chat completion shapes: the request body we accept and the objects we answer.

The body is checked twice on purpose: here for its JSON shape (so the OpenAPI document
says what is accepted), then by `schemas.parse_batch_line` as the body of an OpenAI Batch
line, so a chat completion and a batch line accept exactly the same parameters and give
the same messages for the same mistakes.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

from schemas import InferenceRequest, SchemaError, parse_batch_line
from schemas.batch import CHAT_URL
from schemas.params import TokenId
from schemas.requests import MAX_MESSAGES, PRIORITY_INTERACTIVE


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: Annotated[str, Field(max_length=64)] | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool | None = None


class ChatCompletionRequest(BaseModel):
    """POST /v1/chat/completions. Sampling: max_tokens (or max_completion_tokens),
    temperature, top_p, seed, stop, and vLLM's top_k, stop_token_ids, ignore_eos. Only the
    neutral value of n, penalties, logprobs, logit_bias and response_format is accepted."""

    model_config = ConfigDict(extra="forbid")

    messages: Annotated[list[ChatMessageIn], Field(min_length=1, max_length=MAX_MESSAGES)]
    model: Annotated[str, Field(max_length=256)] | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: bool | None = None
    n: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None

    def to_wire(self, request_id: str, max_prompt_chars: int, max_bytes: int) -> InferenceRequest:
        body = self.model_dump(mode="json", exclude_none=True,
                               exclude={"stream", "stream_options"})
        line = orjson.dumps({"custom_id": request_id, "method": "POST", "url": CHAT_URL,
                             "body": body})
        try:
            req = parse_batch_line(line, max_bytes=max_bytes, max_prompt_chars=max_prompt_chars)
        except SchemaError as exc:  # say `temperature`, not `body.temperature`
            field = exc.field.removeprefix("body.") if exc.field else None
            raise SchemaError(exc.message.replace("body.", ""), field=field,
                              request_id=request_id, code=exc.code) from None
        return req.model_copy(update={"priority": PRIORITY_INTERACTIVE,
                                      "stream": bool(self.stream)})


# --- answers ----------------------------------------------------------------------------

class ChatUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: None = None


class Choice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: Literal["stop", "length"]
    logprobs: None = None


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


def completion(request_id: str, model: str, final: Any) -> dict[str, Any]:
    return {"id": f"chatcmpl-{request_id}", "object": "chat.completion",
            "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": final.text,
                                                 "refusal": None},
                         "finish_reason": finish_of(final.finish_reason), "logprobs": None}],
            "usage": usage_of(final.usage)}


def chunk(request_id: str, model: str, created: int, delta: dict[str, Any],
          finish_reason: str | None = None, usage: dict[str, int] | None = None,
          with_usage: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": f"chatcmpl-{request_id}", "object": "chat.completion.chunk", "created": created,
        "model": model,
        "choices": [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None,
                                              "finish_reason": finish_reason}]}
    if with_usage:
        body["usage"] = usage
    return body
