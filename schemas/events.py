"""Events on `inflight.results` (key = request_id): token events, then exactly one final
event — a FinalEvent, or an ErrorEvent when the request could not run.

Every event carries a `type` discriminator ("token" | "final" | "error");
`schemas.codec.decode_result` reads any of them.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field

from schemas.base import SCHEMA_VERSION, WireId, WireModel
from schemas.params import TokenId

# Engine finish reasons, as vLLM spells them.
FinishReason = Literal["stop", "length", "abort", "error"]
FINISH_REASONS: tuple[str, ...] = ("stop", "length", "abort", "error")

# Known ErrorEvent codes (the field is an open lowercase identifier so new ones need no
# schema change).
ERR_INVALID_REQUEST = "invalid_request"   # not JSON / wrong schema / unknown fields
ERR_MESSAGE_TOO_LARGE = "message_too_large"
ERR_PROMPT_TOO_LONG = "prompt_too_long"   # over the model's context or max_prompt_chars
ERR_ENGINE = "engine_error"
ERR_INTERNAL = "internal_error"
ERR_CANCELLED = "cancelled"
ERR_EXPIRED = "expired"
ERR_STORE_REJECTED = "store_rejected"     # the database refused the request's row (recorder)


class Usage(WireModel):
    prompt_tokens: int = Field(default=0, ge=0)
    completion_tokens: int = Field(default=0, ge=0)
    cached_prompt_tokens: int = Field(default=0, ge=0)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class Timings(WireModel):
    """Epoch seconds of each milestone; None when not reached or not known."""

    submitted_at: float | None = None    # client clock
    queued_at: float | None = None       # worker polled it
    scheduled_at: float | None = None    # first scheduled into a step
    first_token_at: float | None = None
    finished_at: float | None = None

    @property
    def ttft(self) -> float | None:
        start = self.submitted_at if self.submitted_at is not None else self.queued_at
        if start is None or self.first_token_at is None:
            return None
        return self.first_token_at - start


class TokenEvent(WireModel):
    """New tokens of one request. `index` counts this request's token events from 0."""

    type: Literal["token"] = "token"
    schema_version: Literal[1] = SCHEMA_VERSION
    request_id: WireId
    index: int = Field(ge=0)
    token_ids: list[TokenId]
    text: str = ""


class FinalEvent(WireModel):
    """The one final event of a request that ran. `text`/`token_ids` are the full output."""

    type: Literal["final"] = "final"
    schema_version: Literal[1] = SCHEMA_VERSION
    request_id: WireId
    text: str
    token_ids: list[TokenId] = Field(default_factory=list)
    finish_reason: FinishReason
    usage: Usage = Field(default_factory=Usage)
    timings: Timings = Field(default_factory=Timings)
    worker: str | None = Field(default=None, max_length=256)
    batch_id: WireId | None = None


class ErrorEvent(WireModel):
    """The final event of a request that could not run (bad input, engine failure).

    `request_id` is None when the input was too broken to name one.
    """

    type: Literal["error"] = "error"
    schema_version: Literal[1] = SCHEMA_VERSION
    request_id: WireId | None
    code: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,63}$")]
    message: str
    field: str | None = None
    final: Literal[True] = True
    worker: str | None = Field(default=None, max_length=256)
    batch_id: WireId | None = None


ResultEvent = Annotated[Union[TokenEvent, FinalEvent, ErrorEvent], Field(discriminator="type")]
