"""An inference request as it travels on `inflight.requests` / `inflight.requests.batch`.

Priority: LOWER number = MORE urgent (like vLLM and Unix nice). Interactive requests
default to PRIORITY_INTERACTIVE (0); batch-file requests default to PRIORITY_BATCH (10).
The scheduler admits by (priority, arrival) and preempts the highest number first.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import Field, JsonValue, ValidationInfo, model_validator

from inflight.schemas.base import SCHEMA_VERSION, FieldError, FiniteJson, WireId, WireModel
from inflight.schemas.params import SamplingParams, TokenId, WireSamplingParams

PRIORITY_INTERACTIVE = 0
PRIORITY_BATCH = 10
PRIORITY_MIN, PRIORITY_MAX = -1000, 1000

MAX_MESSAGES = 1024
MAX_PROMPT_TOKEN_IDS = 1_048_576
MAX_METADATA_KEYS = 64

Role = Literal["system", "developer", "user", "assistant"]


class ChatMessage(WireModel):
    """One chat turn; the model's chat template turns a list of these into a prompt."""

    role: Role
    content: str
    name: str | None = Field(default=None, max_length=64)


class InferenceRequest(WireModel):
    """Exactly one of `prompt`, `messages`, `prompt_token_ids` is set.

    `stream`: publish coalesced token deltas on the tokens topic. None (the default) = on
    for interactive priorities, off for batch ones (`wants_stream`); a request nobody
    streams costs only its status and final events.

    `submitted_at` is epoch seconds set by the client (defaults to now when built in
    Python; a decoded message without it gets the decode time). Streaming readers seek the
    results partition to this time.

    Validation context `{"max_prompt_chars": N}` (decode_request passes it) rejects prompts
    longer than N characters (messages: the sum of their contents).
    """

    schema_version: Literal[1] = SCHEMA_VERSION
    request_id: WireId
    prompt: Annotated[str, Field(min_length=1)] | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)] | None = None
    prompt_token_ids: Annotated[list[TokenId], Field(min_length=1, max_length=MAX_PROMPT_TOKEN_IDS)] | None = None
    params: WireSamplingParams = Field(default_factory=SamplingParams)
    priority: int = Field(default=PRIORITY_INTERACTIVE, ge=PRIORITY_MIN, le=PRIORITY_MAX)
    batch_id: WireId | None = None
    metadata: Annotated[dict[Annotated[str, Field(min_length=1, max_length=128)], JsonValue],
                        FiniteJson, Field(max_length=MAX_METADATA_KEYS)] = Field(default_factory=dict)
    submitted_at: float = Field(default_factory=time.time, ge=0.0)
    stream: bool | None = None

    @model_validator(mode="after")
    def _exactly_one_input(self, info: ValidationInfo) -> "InferenceRequest":
        given = [name for name in ("prompt", "messages", "prompt_token_ids")
                 if getattr(self, name) is not None]
        if len(given) != 1:
            what = "none of them" if not given else " and ".join(given)
            raise FieldError(given[-1] if given else "prompt",
                             "set exactly one of 'prompt', 'messages', 'prompt_token_ids' "
                             f"(got {what})")
        if self.messages is not None and not any(m.content for m in self.messages):
            raise FieldError("messages", "every message content is empty; send some text")
        limit = (info.context or {}).get("max_prompt_chars") if info.context else None
        if limit is not None and self.prompt_chars > limit:
            raise FieldError(given[0], f"is {self.prompt_chars} characters, over the limit "
                             f"of {limit} (setting INFLIGHT_MAX_PROMPT_CHARS); shorten it",
                             code="prompt_too_long")
        return self

    @property
    def wants_stream(self) -> bool:
        """Whether the worker publishes token deltas (see `stream`)."""
        return self.stream if self.stream is not None else self.priority < PRIORITY_BATCH

    @property
    def prompt_chars(self) -> int:
        if self.prompt is not None:
            return len(self.prompt)
        if self.messages is not None:
            return sum(len(m.content) for m in self.messages)
        return 0

    def prompt_json(self) -> Any:
        """The prompt in a JSON-able form (what the store keeps)."""
        if self.prompt is not None:
            return self.prompt
        if self.messages is not None:
            return [m.model_dump(mode="json", exclude_none=True) for m in self.messages]
        return {"prompt_token_ids": list(self.prompt_token_ids or [])}
