"""Result events, keyed by request_id on two topics:

    inflight.results.tokens   TokenEvent: coalesced deltas, only for requests that stream
    inflight.results          StatusEvent (once per admission), then exactly one final
                              event: a FinalEvent, or an ErrorEvent when it could not run

Every event carries a `type` discriminator ("token" | "status" | "final" | "error") and the
`attempt` that produced it (one admission of the request by one worker; a request redone
after a crash or a rebalance gets a new attempt, and a stream restarts its text on it).
`schemas.codec.decode_result` reads any of them.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field

# ErrorEvent codes: defined with the engine, which sets them too.
from inflight.engine.errors import (ERR_CANCELLED, ERR_ENGINE, ERR_EXPIRED, ERR_INTERNAL,  # noqa: F401
                                    ERR_INVALID_REQUEST, ERR_INVALID_SCHEMA,
                                    ERR_MESSAGE_TOO_LARGE, ERR_PROMPT_TOO_LONG,
                                    ERR_STORE_REJECTED)
from inflight.schemas.base import SCHEMA_VERSION, ModelId, WireId, WireModel
from inflight.schemas.embeddings import EmbeddingB64
from inflight.schemas.params import TokenId
from inflight.schemas.tools import ToolCall

# A request for a model the worker that read it does not serve (written to another model's
# topic): it never runs on the wrong weights (transport/model_topics.py).
ERR_MODEL_NOT_FOUND = "model_not_found"
# A request whose reply_to topic does not exist or is not allowed (INFLIGHT_REPLY_TO_PATTERN)
ERR_REPLY_TO_REFUSED = "reply_to_refused"
# A generation request to a worker serving an embedding model, or the reverse.
ERR_WRONG_MODEL_KIND = "wrong_model_kind"

# Engine finish reasons, as vLLM spells them.
# "expired": stopped at the request's deadline (InferenceRequest.timeout / deadline).
FinishReason = Literal["stop", "length", "abort", "error", "expired"]
FINISH_REASONS: tuple[str, ...] = ("stop", "length", "abort", "error", "expired")


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


# An attempt id: opaque to readers (compared for equality only).
AttemptId = Annotated[str, Field(min_length=1, max_length=128)]


class TopLogprob(WireModel):
    """One candidate token (OpenAI's `top_logprobs` item). `bytes`: the token's UTF-8
    bytes; `token` is their text, or "bytes:\\xNN..." when they are not valid UTF-8 alone."""

    token: str
    logprob: float
    bytes: list[Annotated[int, Field(ge=0, le=255)]] | None = None


class ChatTokenLogprob(TopLogprob):
    """One position of the output (or prompt) in OpenAI's shape (`ChatCompletionTokenLogprob`):
    the chosen token's text, bytes and logprob, and the top alternatives. The engine's own
    record of a position (token ids, rank) is `inflight.engine.logprobs.TokenLogprob`."""

    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class Logprobs(WireModel):
    """OpenAI's `choice.logprobs` of a chat completion: one entry per output token."""

    content: list[ChatTokenLogprob] | None = None


class TokenEvent(WireModel):
    """New tokens of one request since its previous token event (a coalesced delta).

    `index` counts this attempt's token events from 0; `start` is the number of output
    tokens before this delta (so `start + len(token_ids)` tokens exist after it).
    `logprobs`: when the request asked for them, one OpenAI `content` entry ({token,
    logprob, bytes, top_logprobs}) per token of this delta.
    """

    type: Literal["token"] = "token"
    schema_version: Literal[1] = SCHEMA_VERSION
    request_id: WireId
    attempt: AttemptId | None = None
    index: int = Field(ge=0)
    start: int = Field(default=0, ge=0)
    token_ids: list[TokenId]
    text: str = ""
    logprobs: list[ChatTokenLogprob] | None = None


class StatusEvent(WireModel):
    """A worker admitted the request (published once per attempt, on inflight.results)."""

    type: Literal["status"] = "status"
    schema_version: Literal[1] = SCHEMA_VERSION
    request_id: WireId
    attempt: AttemptId | None = None
    status: Literal["running"] = "running"
    worker: str | None = Field(default=None, max_length=256)
    at: float | None = Field(default=None, ge=0.0)  # epoch seconds of the admission


class FinalEvent(WireModel):
    """The one final event of a request that ran. `text`/`token_ids` are the full output."""

    type: Literal["final"] = "final"
    schema_version: Literal[1] = SCHEMA_VERSION
    request_id: WireId
    attempt: AttemptId | None = None
    text: str
    token_ids: list[TokenId] = Field(default_factory=list)
    finish_reason: FinishReason
    usage: Usage = Field(default_factory=Usage)
    timings: Timings = Field(default_factory=Timings)
    worker: str | None = Field(default=None, max_length=256)
    batch_id: WireId | None = None
    # the model that ran it (the worker's served model id)
    model: ModelId | None = None
    # when the request asked (SamplingParams.logprobs / prompt_logprobs); the model's raw
    # log-probabilities. prompt_logprobs[0] is None: the first token has no context.
    logprobs: Logprobs | None = None
    prompt_logprobs: list[ChatTokenLogprob | None] | None = None
    # a request with tools: the calls its answer made (OpenAI's shape; `text` keeps the raw
    # answer, schemas.tools.parse_tool_calls reads both out of it)
    tool_calls: list[ToolCall] | None = None
    # finish_reason "stop" because of one of the request's stop strings: that string
    # (vLLM's field; the Messages API answers it as stop_sequence); else None
    stop_reason: str | None = None
    # an embedding request (kind "embed"): its vector, float32 little-endian bytes in
    # base64 (schemas/embeddings.py: decode_vector)
    embedding: EmbeddingB64 | None = None
    # the request's tenant (InferenceRequest.tenant), copied so the store files it
    tenant: WireId | None = None


class ErrorEvent(WireModel):
    """The final event of a request that could not run (bad input, engine failure).

    `request_id` is None when the input was too broken to name one.
    """

    type: Literal["error"] = "error"
    schema_version: Literal[1] = SCHEMA_VERSION
    request_id: WireId | None
    attempt: AttemptId | None = None
    code: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,63}$")]
    message: str
    field: str | None = None
    final: Literal[True] = True
    worker: str | None = Field(default=None, max_length=256)
    batch_id: WireId | None = None
    # the model the request named (None: it named none, or it could not be read)
    model: ModelId | None = None
    tenant: WireId | None = None  # the request's tenant, when it could be read


ResultEvent = Annotated[Union[TokenEvent, StatusEvent, FinalEvent, ErrorEvent],
                       Field(discriminator="type")]
