"""The request fields OpenAI's chat and text completions share, typed once: strict as
OpenAI is ("5" and true are not 5, NaN is not a number), OpenAI's presence_penalty,
frequency_penalty and logit_bias, vLLM's top_k, stop_token_ids, ignore_eos,
repetition_penalty, min_p, min_tokens, bad_words and allowed_token_ids (definitions:
inflight.engine.sampling_params), and `n` (1 to MAX_N; above 1 only without stream: the
route submits n sibling requests, api/follow.py `answer_siblings`)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from inflight.schemas import SchemaError

from inflight.engine.sampling_params import (MAX_ALLOWED_TOKEN_IDS, MAX_BAD_WORDS,
                                             MAX_LOGIT_BIAS, MAX_TOKENS_LIMIT)
from inflight.schemas.params import MAX_STOP_CHARS, MAX_STOP_STRINGS, MAX_STOP_TOKEN_IDS, SEED_MAX, TokenId

Strict = Field(strict=True)
MAX_N = 16  # sibling sequences of one request (`n`)
StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: Annotated[bool, Strict] | None = None


class OpenAISampling(BaseModel):
    model_config = ConfigDict(extra="forbid")

    temperature: Annotated[float, Field(ge=0.0, le=100.0, strict=True, allow_inf_nan=False)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0, strict=True, allow_inf_nan=False)] | None = None
    top_k: Annotated[int, Field(ge=-1, le=1_000_000, strict=True)] | None = None
    seed: Annotated[int, Field(ge=0, le=SEED_MAX, strict=True)] | None = None
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)] | None = None
    stop_token_ids: Annotated[list[Annotated[TokenId, Strict]], Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    ignore_eos: Annotated[bool, Strict] | None = None
    stream: Annotated[bool, Strict] | None = None
    stream_options: StreamOptions | None = None
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0, strict=True, allow_inf_nan=False)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0, strict=True, allow_inf_nan=False)] | None = None
    logit_bias: Annotated[dict[str, Annotated[float, Field(ge=-100.0, le=100.0, strict=True, allow_inf_nan=False)]],
                          Field(max_length=MAX_LOGIT_BIAS)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0, le=10.0, strict=True, allow_inf_nan=False)] | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0, strict=True, allow_inf_nan=False)] | None = None
    min_tokens: Annotated[int, Field(ge=0, le=MAX_TOKENS_LIMIT, strict=True)] | None = None
    bad_words: Annotated[list[StopString], Field(max_length=MAX_BAD_WORDS)] | None = None
    allowed_token_ids: Annotated[list[Annotated[TokenId, Strict]],
                                 Field(min_length=1, max_length=MAX_ALLOWED_TOKEN_IDS)] | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N, strict=True)] | None = None
    user: str | None = None

    def check_n(self) -> None:
        """`n` > 1 is answered whole: refused with stream (a 400 that says why)."""
        if self.n is not None and self.n > 1 and self.stream:
            raise SchemaError("n > 1 with stream: true is not supported (n > 1 is supported "
                              "without stream: the choices come in one response)", field="n")
