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
      the batch; None = unseeded.
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
        for f in dataclasses.fields(self):
            if f.name != "structured_outputs":
                _check(f, getattr(self, f.name))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def uses_top_k(self) -> bool:
        return self.top_k >= 1

    @property
    def uses_top_p(self) -> bool:
        return self.top_p < 1.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: tuples become lists."""
        out = {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v
               for f in dataclasses.fields(self)}
        if self.structured_outputs is not None:
            out["structured_outputs"] = self.structured_outputs.to_dict()
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
    for i, item in enumerate(value if name in ("stop", "stop_token_ids") else ()):
        if name == "stop" and not (isinstance(item, str) and _STOP_CHARS[0] <= len(item) <= _STOP_CHARS[1]):
            raise SamplingParamsError(f"{name}[{i}]={item!r} must be a string of {_STOP_CHARS[0]}.."
                                      f"{_STOP_CHARS[1]} characters", f"{name}.{i}")
        if name == "stop_token_ids" and not (isinstance(item, int) and not isinstance(item, bool)
                                             and _TOKEN_IDS[0] <= item <= _TOKEN_IDS[1]):
            raise SamplingParamsError(f"{name}[{i}]={item!r} must be a token id in [{_TOKEN_IDS[0]}, "
                                      f"{_TOKEN_IDS[1]}]", f"{name}.{i}")
