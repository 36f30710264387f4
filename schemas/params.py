"""Sampling parameters, vLLM-shaped."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from inflight.schemas.base import SCHEMA_VERSION, WireModel

MAX_TOKENS_LIMIT = 131_072  # generous upper bound; the engine also checks the model's context
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
MAX_STOP_TOKEN_IDS = 64
SEED_MAX = 2**63 - 1
MAX_LOGPROBS = 20  # alternatives per token (OpenAI's top_logprobs limit)

TokenId = Annotated[int, Field(ge=0, le=2**31 - 1)]


class SamplingParams(WireModel):
    """How to sample one request.

    - `max_tokens`: tokens to generate, 1..131072 (the engine also caps by context length).
    - `temperature`: 0 = greedy; otherwise softmax temperature, 0..100.
    - `top_p`: nucleus mass in (0, 1]; 1 = off.
    - `top_k`: -1 or 0 = off (vLLM convention: both mean "all tokens"); k >= 1 keeps the k
      most likely tokens.
    - `seed`: per-request seed (0..2**63-1) for reproducible sampling; None = unseeded.
    - `stop`: a string or a list of strings (<= 16, each 1..256 chars); decoded to a list.
    - `stop_token_ids`: extra token ids that end generation (besides EOS).
    - `ignore_eos`: keep generating past EOS until `max_tokens` (benchmarks).
    - `logprobs`: None = off; n (0..20) = each output token's log-probability plus the n
      most likely alternatives (FinalEvent.logprobs, OpenAI's choice.logprobs shape).
    - `prompt_logprobs`: the same for each prompt token (FinalEvent.prompt_logprobs); such a
      request recomputes its prompt rather than reading the prefix cache.
    """

    schema_version: Literal[1] = SCHEMA_VERSION
    max_tokens: int = Field(default=256, ge=1, le=MAX_TOKENS_LIMIT)
    temperature: float = Field(default=1.0, ge=0.0, le=100.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=-1, ge=-1, le=1_000_000)
    seed: int | None = Field(default=None, ge=0, le=SEED_MAX)
    stop: list[Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]] = Field(
        default_factory=list, max_length=MAX_STOP_STRINGS)
    stop_token_ids: list[TokenId] = Field(default_factory=list, max_length=MAX_STOP_TOKEN_IDS)
    ignore_eos: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    prompt_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_as_list(cls, value: object) -> object:
        if value is None:
            return []
        if isinstance(value, str):
            return [value]
        return value

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def top_k_enabled(self) -> bool:
        return self.top_k >= 1
