"""HTTP shapes of single requests: the body of POST /v1/requests and the request object
that POST, GET and DELETE answer with."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from inflight.schemas import ChatMessage, InferenceRequest
from inflight.schemas.base import ID_PATTERN, TopicName
from inflight.schemas.codec import schema_error
from inflight.schemas.params import TokenId, WireSamplingParams
from inflight.schemas.requests import MAX_MESSAGES, MAX_METADATA_KEYS, PRIORITY_MAX, PRIORITY_MIN
from inflight.schemas.tools import MAX_TOOLS, Tool, ToolChoice

RequestStatus = Literal["queued", "running", "completed", "failed", "cancelled", "expired"]
RequestId = Annotated[str, Field(pattern=ID_PATTERN, max_length=128,
                                 description="letters, digits and . _ : -, starting with a "
                                             "letter or digit; at most 128 characters")]


class SubmitRequest(BaseModel):
    """One inference request. Give exactly one of `prompt`, `messages`, `prompt_token_ids`.

    `request_id` is the idempotency key: sending the same id again returns the first
    request and runs nothing new. Priority: lower is more urgent (0 interactive; 10 and
    above go to the batch topic)."""

    # NOTE: the inputs are typed without null and the schema says "exactly one of" (oneOf
    # over which key is present), so the OpenAPI document describes what is accepted.
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"oneOf": [
        {"required": ["prompt"]}, {"required": ["messages"]}, {"required": ["prompt_token_ids"]}]})

    request_id: RequestId | None = None
    model: Annotated[str, Field(max_length=256)] | None = Field(
        default=None, description="the model to run it (GET /v1/models); absent or "
                                  "`default`: the default model")
    prompt: Annotated[str, Field(min_length=1)] = None  # type: ignore[assignment]
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)] = None  # type: ignore[assignment]
    prompt_token_ids: Annotated[list[TokenId], Field(min_length=1)] = None  # type: ignore[assignment]
    params: WireSamplingParams | None = None
    priority: int = Field(default=0, ge=PRIORITY_MIN, le=PRIORITY_MAX)
    metadata: Annotated[dict[Annotated[str, Field(min_length=1, max_length=128)], JsonValue],
                        Field(max_length=MAX_METADATA_KEYS)] | None = None
    stream: bool | None = Field(default=None, description="publish token deltas (for GET "
                                ".../events); default: on below priority 10, off above")
    tools: Annotated[list[Tool], Field(min_length=1, max_length=MAX_TOOLS)] | None = Field(
        default=None, description="OpenAI function tools (with messages): the answer's calls "
                                  "come back as the result's tool_calls")
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    timeout: float | None = Field(default=None, gt=0, description="seconds from submit: not "
                                  "done by then, it ends `expired` (not started: without "
                                  "running; running: with what it produced)")
    deadline: float | None = Field(default=None, ge=0, description="the same as an absolute "
                                   "time (epoch seconds)")
    reply_to: TopicName | None = Field(
        default=None, description="a Kafka topic of yours that also gets the request's final "
                                  "event (and its token deltas when it streams); it must exist "
                                  "and match INFLIGHT_REPLY_TO_PATTERN (docs/kafka-contract.md)")

    def to_wire(self, request_id: str, max_prompt_chars: int) -> InferenceRequest:
        """The wire request (raises SchemaError naming the field, e.g. two inputs given)."""
        fields: dict[str, Any] = {"request_id": request_id, "priority": self.priority}
        for name in ("prompt", "messages", "prompt_token_ids", "params", "metadata", "stream",
                     "tools", "tool_choice", "parallel_tool_calls", "timeout", "deadline", "reply_to"):
            value = getattr(self, name)
            if value is not None:
                fields[name] = value
        try:
            return InferenceRequest.model_validate(
                fields, context={"max_prompt_chars": max_prompt_chars})
        except ValidationError as exc:
            raise schema_error(exc, raw=None, request_id=request_id,
                               model=InferenceRequest) from None


class UsageOut(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0
    total_tokens: int = 0


class ErrorOut(BaseModel):
    code: str | None
    message: str


class RequestObject(BaseModel):
    """A request as the store knows it. Times are epoch seconds."""

    id: str
    object: Literal["request"] = "request"
    status: RequestStatus
    created_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    batch_id: str | None = None
    priority: int | None = None
    text: str | None = None
    token_ids: list[int] | None = None
    finish_reason: str | None = None
    usage: UsageOut | None = None
    timings: dict[str, float | None] | None = None
    error: ErrorOut | None = None
    worker: str | None = None
    attempts: int = 0
    model: str | None = Field(default=None, description="the model it named, then the one "
                              "that ran it")
    logprobs: dict[str, Any] | None = Field(default=None, description="when params.logprobs "
                                            "was set: OpenAI's choice.logprobs object (plus "
                                            "prompt_logprobs when asked)")
    tool_calls: list[dict[str, Any]] | None = Field(default=None, description="a request "
                                                    "with tools: the calls its answer made "
                                                    "(OpenAI's message.tool_calls)")
    tenant: str | None = Field(default=None, description="who it is for (the key's owner)")


def _epoch(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def request_object(row: Any) -> dict[str, Any]:
    """A store row (anything with the `requests` column attributes) -> RequestObject fields,
    as a plain dict ready for JSON."""
    usage = row.usage
    if usage is not None:
        usage = {"prompt_tokens": usage.get("prompt_tokens", 0),
                 "completion_tokens": usage.get("completion_tokens", 0),
                 "cached_prompt_tokens": usage.get("cached_prompt_tokens", 0),
                 "total_tokens": usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0)}
    error = None
    if row.error is not None or row.error_code is not None:
        error = {"code": row.error_code, "message": row.error or ""}
    return {"id": row.id, "object": "request", "status": row.status,
            "created_at": _epoch(row.created_at), "started_at": _epoch(row.started_at),
            "finished_at": _epoch(row.finished_at), "batch_id": row.batch_id,
            "priority": row.priority, "text": row.output, "token_ids": row.output_token_ids,
            "finish_reason": row.finish_reason, "usage": usage, "timings": row.timings,
            "error": error, "worker": row.worker, "attempts": row.attempts or 0,
            "model": row.model, "logprobs": row.logprobs, "tool_calls": row.tool_calls,
            "tenant": getattr(row, "tenant", None)}


def queued_object(req: InferenceRequest, model: str | None = None) -> dict[str, Any]:
    """The request object of a request just filed (what POST answers, without re-reading);
    `model`: its model's name (the request carries none for the default model)."""
    return {"id": req.request_id, "object": "request", "status": "queued",
            "created_at": req.submitted_at, "started_at": None, "finished_at": None,
            "batch_id": req.batch_id, "priority": req.priority, "text": None,
            "token_ids": None, "finish_reason": None, "usage": None, "timings": None,
            "error": None, "worker": None, "attempts": 0, "model": req.model or model,
            "logprobs": None, "tool_calls": None, "tenant": req.tenant}
