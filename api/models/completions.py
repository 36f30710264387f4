"""OpenAI (legacy) text completion shapes: the body of POST /v1/completions and the
`text_completion` objects we answer, with `echo` and the legacy `logprobs` object that
evaluation harnesses read to score a prompt:

    "logprobs": {"tokens": ["The", " cat"], "token_logprobs": [null, -2.3],
                 "top_logprobs": [null, {" cat": -2.3, " dog": -2.9}], "text_offset": [0, 3]}

Like a chat completion, the body is then checked again as the body of an OpenAI Batch line
for /v1/completions (`schemas.parse_batch_line`), so both accept the same parameters with
the same messages.
"""

from __future__ import annotations

import codecs
import dataclasses
import time
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

from inflight.api.models.sampling import MAX_N, OpenAISampling, Strict
from inflight.schemas import InferenceRequest, SchemaError, parse_batch_line
from inflight.schemas.batch import COMPLETIONS_URL
from inflight.schemas.params import MAX_TOKENS_LIMIT, TokenId
from inflight.schemas.requests import MAX_PROMPT_TOKEN_IDS, PRIORITY_INTERACTIVE

MAX_LEGACY_LOGPROBS = 5   # OpenAI's limit for the legacy `logprobs` integer
DEFAULT_MAX_TOKENS = 16   # OpenAI's default for /v1/completions

TokenIds = Annotated[list[Annotated[TokenId, Strict]], Field(min_length=1,
                                                             max_length=MAX_PROMPT_TOKEN_IDS)]
Prompt = (Annotated[str, Field(min_length=1)] | TokenIds
          | Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1, max_length=1)]
          | Annotated[list[TokenIds], Field(min_length=1, max_length=1)])


class CompletionRequest(OpenAISampling):
    """POST /v1/completions: one prompt (a string or token ids; a list of one of either),
    `echo` returns the prompt before the completion; `logprobs` (0-5) returns the
    legacy logprobs object, of the prompt too with `echo` (max_tokens 0 with echo scores the
    prompt alone); `n` sibling completions without stream, `best_of` only at 1. vLLM's top_k, stop_token_ids and ignore_eos are accepted."""

    model_config = ConfigDict(extra="forbid")

    model: Annotated[str, Field(max_length=256)]
    prompt: Prompt
    max_tokens: Annotated[int, Field(ge=0, le=MAX_TOKENS_LIMIT, strict=True)] | None = None
    echo: Annotated[bool, Strict] | None = None
    logprobs: Annotated[int, Field(ge=0, le=MAX_LEGACY_LOGPROBS, strict=True)] | None = None
    # accepted only at their neutral values
    best_of: Annotated[int, Field(ge=1, le=MAX_N, strict=True)] | None = None
    suffix: Annotated[str, Field(max_length=0)] | None = None

    @property
    def prompt_ids(self) -> list[int] | None:
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], list):
            return p[0]
        if isinstance(p, list) and p and isinstance(p[0], int):
            return p  # type: ignore[return-value]
        return None

    @property
    def prompt_text(self) -> str | None:
        p = self.prompt
        return p if isinstance(p, str) else (p[0] if isinstance(p, list) and isinstance(p[0], str)
                                             else None)

    @property
    def scores_only(self) -> bool:
        """max_tokens 0 with echo: score the prompt, generate nothing."""
        return self.max_tokens == 0

    def to_wire(self, request_id: str, max_prompt_chars: int, max_bytes: int) -> InferenceRequest:
        if self.max_tokens == 0 and not self.echo:
            raise SchemaError("max_tokens: 0 generates nothing; it is allowed only with "
                              "echo: true (to score the prompt)", field="max_tokens")
        if self.logprobs is not None and self.stream:
            raise SchemaError("logprobs are answered with the whole completion; use them "
                              "with stream: false", field="logprobs")
        self.check_n()
        if self.best_of is not None and self.best_of > 1:
            raise SchemaError("best_of > 1 is not supported (candidates are not ranked by "
                              "log probability); use n for several completions",
                              field="best_of")
        if self.echo and self.stream and self.prompt_text is None:
            raise SchemaError("echo with stream needs a text prompt (token ids are echoed "
                              "only with stream: false)", field="echo")
        body = self.model_dump(mode="json", exclude_none=True, exclude={
            "stream", "stream_options", "echo", "logprobs", "model", "prompt", "max_tokens", "n",
            "best_of"})
        body["prompt"] = self.prompt_ids if self.prompt_ids is not None else self.prompt_text
        # NOTE: a scoring request (echo, max_tokens 0) runs one step for the prompt's
        # logprobs; the token it samples is dropped from the answer
        body["max_tokens"] = max(self.max_tokens if self.max_tokens is not None
                                 else DEFAULT_MAX_TOKENS, 1)
        line = orjson.dumps({"custom_id": request_id, "method": "POST", "url": COMPLETIONS_URL,
                             "body": body})
        try:
            req = parse_batch_line(line, max_bytes=max_bytes, max_prompt_chars=max_prompt_chars)
        except SchemaError as exc:  # say `temperature`, not `body.temperature`
            field = exc.field.removeprefix("body.") if exc.field else None
            raise SchemaError(exc.message.replace("body.", ""), field=field,
                              request_id=request_id, code=exc.code) from None
        params = req.params
        if self.logprobs is not None:
            params = dataclasses.replace(params, logprobs=self.logprobs)
        if self.echo and (self.logprobs is not None or self.prompt_text is None):
            # the prompt's token texts (and their logprobs, when asked) come from the engine
            params = dataclasses.replace(params, prompt_logprobs=self.logprobs or 0)
        return req.model_copy(update={"priority": PRIORITY_INTERACTIVE,
                                      "stream": bool(self.stream), "params": params})


# --- answers ----------------------------------------------------------------------------

class LegacyLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: LegacyLogprobs | None = None
    finish_reason: Literal["stop", "length"] | None = None


class CompletionUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage | None = None


def _entries(items: list[Any]) -> tuple[list[str], list[bytes], list[float | None],
                                         list[dict[str, float] | None]]:
    tokens: list[str] = []
    raw: list[bytes] = []
    lps: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    for item in items:
        if item is None:  # the first prompt token: nothing before it to condition on
            tokens.append("")
            raw.append(b"")
            lps.append(None)
            tops.append(None)
            continue
        tokens.append(item.token)
        raw.append(bytes(item.bytes) if item.bytes is not None else item.token.encode())
        lps.append(item.logprob)
        top = {t.token: t.logprob for t in item.top_logprobs}
        top.setdefault(item.token, item.logprob)  # the chosen token too, as OpenAI does
        tops.append(top)
    return tokens, raw, lps, tops


def _offsets(raw: list[bytes]) -> list[int]:
    """Where each token starts in the text, in characters. NOTE: decoded incrementally
    over the tokens' bytes, since a token may hold part of a character (its text then reads
    "bytes:\\x.."): a token that completes a character starts where that character does."""
    decode = codecs.getincrementaldecoder("utf-8")("replace").decode
    out, at = [], 0
    for piece in raw:
        out.append(at)
        at += len(decode(piece))
    return out


def completion_text(body: CompletionRequest, final: Any) -> tuple[str, dict[str, Any] | None]:
    """(choice text, legacy logprobs or None) of a final event."""
    out = [] if body.scores_only else list((final.logprobs.content if final.logprobs else None) or [])
    text = "" if body.scores_only else final.text
    prompt_items = list(final.prompt_logprobs or []) if body.echo else []
    tokens, raw, lps, tops = _entries(prompt_items + out)
    if body.echo:
        echoed = body.prompt_text
        if echoed is None:  # token ids: their texts, as the model's tokenizer writes them
            echoed = b"".join(raw[:len(prompt_items)]).decode("utf-8", "replace")
        elif prompt_items and prompt_items[0] is None:
            # NOTE: the first prompt token has no logprob and so no entry; its text is what
            # the prompt holds before the bytes of the others (empty for a BOS token)
            whole, rest = echoed.encode(), b"".join(raw[1:len(prompt_items)])
            if whole.endswith(rest):
                raw[0] = whole[:len(whole) - len(rest)]
                tokens[0] = raw[0].decode("utf-8", "replace")
        text = echoed + text
    if body.logprobs is None:
        return text, None
    return text, {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops,
                  "text_offset": _offsets(raw)}


def completion(request_id: str, model: str, body: CompletionRequest, final: Any) -> dict[str, Any]:
    text, logprobs = completion_text(body, final)
    p = final.usage.prompt_tokens
    c = 0 if body.scores_only else final.usage.completion_tokens
    return {"id": f"cmpl-{request_id}", "object": "text_completion", "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": logprobs,
                         "finish_reason": "length" if final.finish_reason == "length"
                         or body.scores_only else "stop"}],
            "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}}


def chunk(request_id: str, model: str, created: int, text: str,
          finish_reason: str | None = None, usage: dict[str, int] | None = None,
          with_usage: bool = False, choices: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": f"cmpl-{request_id}", "object": "text_completion", "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None,
                     "finish_reason": finish_reason}] if choices else []}
    if with_usage:
        body["usage"] = usage
    return body
