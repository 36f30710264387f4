"""Per-request sampling parameters: the one definition, for the engine and the wire.

The ranges are written once, as each field's metadata: `__post_init__` enforces them for
whoever builds a `SamplingParams` in Python, and the wire (`inflight.schemas`) validates
JSON straight into this class with the same metadata (pydantic reads `ge`/`le`/`gt`/
`max_length`/`strict`/`allow_inf_nan` from `dataclasses.field(metadata=...)`, and the class
attribute `__pydantic_config__`), so a bad value gets a field-named error there. This module
imports neither torch nor pydantic.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass, field
from typing import Any

from inflight.engine.errors import InflightError
from inflight.engine.structured_outputs import StructuredOutputs, StructuredOutputsError

MAX_TOKENS_LIMIT = 131_072  # generous upper bound; the engine also checks the model's context
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
MAX_STOP_TOKEN_IDS = 64
MAX_TOKEN_ID = 2**31 - 1
SEED_MAX = 2**63 - 1
MAX_LOGPROBS = 20  # alternatives per position (OpenAI's top_logprobs limit)
MAX_TOP_K = 1_000_000
MAX_LOGIT_BIAS = 1024          # entries of logit_bias (OpenAI: -100..100 each)
MAX_BAD_WORDS = 64
MAX_ALLOWED_TOKEN_IDS = 131_072


class SamplingParamsError(InflightError, ValueError):
    """A sampling parameter has a value the engine cannot use; `field` names it."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


def _limits(default: Any, **metadata: Any) -> Any:
    """A field with its range; numbers are strict ("5" is not 5, true is not 1) and finite."""
    return field(default=default, metadata={"strict": True, "allow_inf_nan": False, **metadata})


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request (vLLM conventions).

    - `max_tokens`: tokens to generate, 1..131072 (the engine also caps by context length).
    - `temperature`: 0 = greedy; otherwise softmax temperature, 0..100.
    - `top_p`: nucleus mass in (0, 1]; 1 = off.
    - `top_k`: -1 or 0 = off (both mean "all tokens"); k >= 1 keeps the k most likely.
    - `seed`: per-request seed (0..2**63-1): sampling is reproducible whatever else is in
      the batch; None = unseeded. A request on the wire never travels unseeded: one
      without a seed gets `seed_for(request_id)` when it is built (schemas/requests.py),
      so a redo on another worker samples the same tokens.
    - `stop`: strings (<= 16, each 1..256 chars) that end generation; not included in the
      output text. A single string is taken as a one-element tuple.
    - `stop_token_ids`: extra token ids that end generation (besides EOS).
    - `ignore_eos`: keep generating past EOS until `max_tokens` (benchmarks).
    - `logprobs`: None = off; n (0..20) = the log-probability of each sampled token plus the
      n most likely alternatives. `prompt_logprobs`: the same for each prompt token given
      the ones before it (the first has none); such a request recomputes its whole prompt
      instead of taking prefix-cache hits. Both are the model's raw logprobs
      (engine/logprobs.py); for a constrained request, of the masked distribution.
    - `structured_outputs`: what the output must match (a JSON schema, any JSON object, a
      regex, one of some strings, a grammar, a structural tag): `StructuredOutputs`, or its
      dict form `{"json": {...}}` (engine/structured_outputs.py). The grammar's end stops
      the request ("stop"); `max_tokens` reached first ends it with "length".
    - Logits processors (vLLM's / OpenAI's definitions; engine/logits_processors.py),
      applied in this order before temperature: `allowed_token_ids` (only these may be
      sampled), `bad_words` (words never emitted: each word's tokens, with and without a
      leading space, are banned once the tokens before its last one are the output's
      tail), `logit_bias` ({token id: -100..100} added to the logit), `min_tokens` (EOS
      and stop_token_ids masked until this many tokens are out), `repetition_penalty`
      (transformers': a logit of a token in the prompt or output is divided by it when
      positive, multiplied when negative; 1 = off), `frequency_penalty` /
      `presence_penalty` (OpenAI's: logit -= count * frequency + (count > 0) * presence,
      counts of the output tokens; -2..2, 0 = off); after temperature, `min_p` (tokens
      whose probability is below min_p times the top one are dropped; 0 = off).
    - `speculative`: whether this request may speculate when the engine has a
      speculative_config: None = yes for interactive priorities, no for batch ones
      (priority >= its `batch_priority`); True / False force it. Greedy output is the
      same either way; sampled output keeps its distribution (engine/spec/). A request with
      `structured_outputs` never speculates (its drafts would need a mask each).
    """

    # NOTE: read by pydantic when the wire validates into this class (the engine never
    # imports pydantic): unknown keys are errors; each field sets its own strictness.
    __pydantic_config__ = {"extra": "forbid", "strict": False}

    max_tokens: int = _limits(256, ge=1, le=MAX_TOKENS_LIMIT)
    temperature: float = _limits(1.0, ge=0.0, le=100.0)
    top_p: float = _limits(1.0, gt=0.0, le=1.0)
    top_k: int = _limits(-1, ge=-1, le=MAX_TOP_K)
    seed: int | None = _limits(None, ge=0, le=SEED_MAX)
    stop: tuple[str, ...] = field(default=(), metadata={"max_length": MAX_STOP_STRINGS})
    stop_token_ids: tuple[int, ...] = field(default=(), metadata={"max_length": MAX_STOP_TOKEN_IDS})
    ignore_eos: bool = _limits(False)
    logprobs: int | None = _limits(None, ge=0, le=MAX_LOGPROBS)
    prompt_logprobs: int | None = _limits(None, ge=0, le=MAX_LOGPROBS)
    speculative: bool | None = _limits(None)
    structured_outputs: StructuredOutputs | None = None
    presence_penalty: float = _limits(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = _limits(0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = _limits(1.0, gt=0.0, le=10.0)
    min_p: float = _limits(0.0, ge=0.0, le=1.0)
    min_tokens: int = _limits(0, ge=0, le=MAX_TOKENS_LIMIT)
    logit_bias: dict[int, float] | None = field(default=None, metadata={"max_length": MAX_LOGIT_BIAS})
    bad_words: tuple[str, ...] = field(default=(), metadata={"max_length": MAX_BAD_WORDS})
    allowed_token_ids: tuple[int, ...] | None = field(
        default=None, metadata={"max_length": MAX_ALLOWED_TOKEN_IDS})

    def __post_init__(self) -> None:
        so = self.structured_outputs
        if isinstance(so, dict):
            object.__setattr__(self, "structured_outputs", _structured(so))
        elif so is not None and not isinstance(so, StructuredOutputs):
            raise SamplingParamsError("structured_outputs must be a StructuredOutputs or its dict "
                                      f"form (got {type(so).__name__})", "structured_outputs")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop or ()))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids or ()))
        object.__setattr__(self, "bad_words", tuple(self.bad_words or ()))
        if self.allowed_token_ids is not None:
            object.__setattr__(self, "allowed_token_ids", tuple(self.allowed_token_ids))
        for f in dataclasses.fields(self):
            if f.name not in ("structured_outputs", "logit_bias"):
                _check(f, getattr(self, f.name))
        if self.logit_bias is not None:
            object.__setattr__(self, "logit_bias", _logit_bias(self.logit_bias))
        if self.min_tokens > self.max_tokens:
            raise SamplingParamsError(f"min_tokens={self.min_tokens} is more than max_tokens="
                                      f"{self.max_tokens}: lower it", "min_tokens")
        if self.allowed_token_ids is not None and not self.allowed_token_ids:
            raise SamplingParamsError("allowed_token_ids is empty: no token could be sampled; "
                                      "give at least one, or leave it out", "allowed_token_ids")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def uses_top_k(self) -> bool:
        return self.top_k >= 1

    @property
    def uses_top_p(self) -> bool:
        return self.top_p < 1.0

    @property
    def uses_penalties(self) -> bool:
        """Does a logit depend on the tokens so far (counts kept on the device)?"""
        return (self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or self.repetition_penalty != 1.0)

    @property
    def uses_logits_processors(self) -> bool:
        """Any of the logits processors (engine/logits_processors.py) is on."""
        return (self.uses_penalties or self.min_p > 0.0 or self.min_tokens > 0
                or bool(self.logit_bias) or bool(self.bad_words)
                or self.allowed_token_ids is not None)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: tuples become lists."""
        out = {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v
               for f in dataclasses.fields(self)}
        if self.logit_bias is not None:  # JSON object keys are strings
            out["logit_bias"] = {str(k): v for k, v in self.logit_bias.items()}
        if self.structured_outputs is not None:
            out["structured_outputs"] = self.structured_outputs.to_dict()
        return out


def seed_for(request_id: str) -> int:
    """The seed a request without one samples with: 63 bits of a hash of its id (ids are
    unique, so two requests share a seed only when a user gives both the same one)."""
    digest = hashlib.blake2b(request_id.encode(), digest_size=8, person=b"inflight-seed").digest()
    return int.from_bytes(digest, "big") >> 1


def _logit_bias(value: Any) -> dict[int, float]:
    """{token id: bias}: ids as ints or their decimal strings (JSON keys), biases finite
    numbers in [-100, 100] (OpenAI's range)."""
    if not isinstance(value, dict):
        raise SamplingParamsError("logit_bias must be an object of token id -> bias", "logit_bias")
    if len(value) > MAX_LOGIT_BIAS:
        raise SamplingParamsError(f"logit_bias has {len(value)} entries; at most {MAX_LOGIT_BIAS}",
                                  "logit_bias")
    out: dict[int, float] = {}
    for key, bias in value.items():
        tid = key if isinstance(key, int) and not isinstance(key, bool) else \
            int(key) if isinstance(key, str) and key.isdigit() else None
        if tid is None or not 0 <= tid <= MAX_TOKEN_ID:
            raise SamplingParamsError(f"logit_bias key {key!r} must be a token id (0..{MAX_TOKEN_ID})",
                                      "logit_bias")
        if not isinstance(bias, (int, float)) or isinstance(bias, bool) or not math.isfinite(bias) \
                or not -100.0 <= bias <= 100.0:
            raise SamplingParamsError(f"logit_bias[{key!r}]={bias!r} must be a number in [-100, 100]",
                                      f"logit_bias.{key}")
        out[tid] = float(bias)
    return out


def _structured(value: dict[str, Any]) -> StructuredOutputs:
    try:
        return StructuredOutputs(**value)
    except TypeError:
        unknown = sorted(set(value) - {f.name for f in dataclasses.fields(StructuredOutputs)})
        raise StructuredOutputsError(f"structured_outputs: unknown key(s) {unknown}; use one "
                                     "of json, json_object, regex, choice, grammar, structural_tag",
                                     "structured_outputs") from None
    except StructuredOutputsError as exc:
        where = "structured_outputs" + (f".{exc.field}" if exc.field else "")
        raise StructuredOutputsError(f"{where}: {exc}", where, exc.code) from None


# Rules for each entry of a tuple field (pydantic's field metadata has no per-item keys, so
# the wire reaches these through __post_init__).
_STOP_CHARS = (1, MAX_STOP_CHARS)
_TOKEN_IDS = (0, MAX_TOKEN_ID)


def _check(f: dataclasses.Field, value: Any) -> None:
    """One field against its metadata: the same rules the wire applies."""
    md, name = f.metadata, f.name
    if value is None and f.default is None:
        return
    if f.type in ("int", "int | None"):
        if not isinstance(value, int) or isinstance(value, bool):
            raise SamplingParamsError(f"{name}={value!r} must be an integer", name)
    elif f.type == "float":
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise SamplingParamsError(f"{name}={value!r} must be a finite number", name)
    elif f.type in ("bool", "bool | None") and not isinstance(value, bool):
        raise SamplingParamsError(f"{name}={value!r} must be true or false", name)
    lo, hi = md.get("ge", md.get("gt")), md.get("le")
    if lo is not None and (value < lo or (value == lo and "gt" in md)) or hi is not None and value > hi:
        opening = "(" if "gt" in md else "["
        raise SamplingParamsError(f"{name}={value!r} must be in {opening}{lo}, {hi}]", name)
    if "max_length" in md and len(value) > md["max_length"]:
        raise SamplingParamsError(f"{name} has {len(value)} entries; at most {md['max_length']}", name)
    items = value if name in ("stop", "stop_token_ids", "bad_words", "allowed_token_ids") else None
    for i, item in enumerate(items or ()):
        if name in ("stop", "bad_words") and not (isinstance(item, str) and
                                                  _STOP_CHARS[0] <= len(item) <= _STOP_CHARS[1]):
            raise SamplingParamsError(f"{name}[{i}]={item!r} must be a string of {_STOP_CHARS[0]}.."
                                      f"{_STOP_CHARS[1]} characters", f"{name}.{i}")
        if name in ("stop_token_ids", "allowed_token_ids") and not (
                isinstance(item, int) and not isinstance(item, bool)
                and _TOKEN_IDS[0] <= item <= _TOKEN_IDS[1]):
            raise SamplingParamsError(f"{name}[{i}]={item!r} must be a token id in [{_TOKEN_IDS[0]}, "
                                      f"{_TOKEN_IDS[1]}]", f"{name}.{i}")
