"""Speculative decoding settings, under vLLM's `speculative_config` keys.

    EngineConfig(model=..., speculative_config={"method": "ngram", "num_speculative_tokens": 4,
                                                "prompt_lookup_min": 2, "prompt_lookup_max": 4})
    {"method": "draft_model", "model": "/models/small", "num_speculative_tokens": 3}
    {"method": "suffix", "num_speculative_tokens": 8, "suffix_decoding_max_cached_requests": 1000}

The same dict comes as JSON from `INFLIGHT_SPECULATIVE_CONFIG` or `inflight worker
--speculative-config`. Keys this engine does not implement are refused by name (a vLLM key
that would change what runs must never be silently ignored).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Any, Mapping

from inflight.engine.errors import ConfigError

METHODS = ("ngram", "draft_model", "suffix")

# NOTE: measured on CPU (benchmarks/spec_decode.py, docs/benchmarks.md): above this many
# running requests a step is already compute-bound and verifying drafts costs more than it
# gives; the same cut-off is what vLLM users set for GPUs at high load.
DEFAULT_DISABLE_BY_BATCH_SIZE = 8
# Requests of this priority value or higher (the wire's PRIORITY_BATCH) do not speculate
# unless their SamplingParams.speculative is True: an overnight batch keeps the device busy.
DEFAULT_BATCH_PRIORITY = 10
@dataclass(frozen=True)
class SpeculativeConfig:
    """How drafts are proposed and when speculation runs.

    - `method`: "ngram" (prompt lookup in the request's own prompt and output),
      "draft_model" (a smaller model sharing the tokenizer; `model` is its folder) or
      "suffix" (the request's own context plus a cache of recent outputs of all requests).
    - `num_speculative_tokens`: drafts verified per step, at most (k).
    - `prompt_lookup_min` / `prompt_lookup_max`: n-gram lengths tried, longest first.
    - `disable_by_batch_size`: a step with more running requests than this does not
      speculate (None: always may).
    - `batch_priority`: requests with a priority value >= this do not speculate unless
      their SamplingParams.speculative is True (inflight's own key).
    - `draft_token_cost`: what one draft token adds to a verification forward, as a share
      of a plain decode step; each request then verifies as many drafts (<= k) as pay for
      themselves at its own acceptance rate (engine/spec/adaptive.py). 0 = always k (vLLM's
      behaviour); None = measured on the device at hand at start-up and kept under
      EngineConfig.cache_dir, or without one the documented curve of the device type
      (engine/spec/verify_costs.py, verify_costs.json). Inflight's own key.
    - `suffix_decoding_max_tree_depth`: longest context suffix matched; a draft is at most
      `suffix_decoding_max_spec_factor` x the match length long;
      `suffix_decoding_min_token_prob`: a draft token needs at least this share of the
      cached continuations; `suffix_decoding_max_cached_requests`: outputs kept (FIFO).
    """

    method: str
    num_speculative_tokens: int
    model: str | None = None
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 4
    disable_by_batch_size: int | None = DEFAULT_DISABLE_BY_BATCH_SIZE
    batch_priority: int = DEFAULT_BATCH_PRIORITY
    draft_token_cost: float | None = None
    suffix_decoding_max_tree_depth: int = 24
    suffix_decoding_max_cached_requests: int = 1000
    suffix_decoding_max_spec_factor: float = 1.0
    suffix_decoding_min_token_prob: float = 0.1

    def __post_init__(self) -> None:
        def bad(key: str, why: str) -> ConfigError:
            return ConfigError(f"speculative_config {key}={getattr(self, key)!r} {why}")

        if self.method not in METHODS:
            raise bad("method", f"is not supported; use one of {', '.join(METHODS)}")
        if not isinstance(self.num_speculative_tokens, int) or not 1 <= self.num_speculative_tokens <= 64:
            raise bad("num_speculative_tokens", "must be an integer in [1, 64]")
        if self.method == "draft_model" and not self.model:
            raise ConfigError('speculative_config method "draft_model" needs "model": the draft '
                              "model's folder (a smaller model sharing the target's tokenizer)")
        if self.method != "draft_model" and self.model:
            raise bad("model", f'is only read by method "draft_model", not {self.method!r}')
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ConfigError(f"speculative_config prompt_lookup_min={self.prompt_lookup_min} and "
                              f"prompt_lookup_max={self.prompt_lookup_max} must satisfy 1 <= min <= max")
        if self.disable_by_batch_size is not None and self.disable_by_batch_size < 1:
            raise bad("disable_by_batch_size", "must be >= 1 (or null: never disabled)")
        if self.draft_token_cost is not None and not 0.0 <= self.draft_token_cost <= 10.0:
            raise bad("draft_token_cost", "must be in [0, 10] (0: always num_speculative_tokens)")
        if self.suffix_decoding_max_tree_depth < 1:
            raise bad("suffix_decoding_max_tree_depth", "must be >= 1")
        if self.suffix_decoding_max_cached_requests < 0:
            raise bad("suffix_decoding_max_cached_requests", "must be >= 0")
        if self.suffix_decoding_max_spec_factor <= 0:
            raise bad("suffix_decoding_max_spec_factor", "must be > 0")
        if not 0.0 <= self.suffix_decoding_min_token_prob <= 1.0:
            raise bad("suffix_decoding_min_token_prob", "must be in [0, 1]")

    @classmethod
    def from_value(cls, value: "SpeculativeConfig | Mapping[str, Any] | str") -> "SpeculativeConfig":
        """From a dict with vLLM's keys, its JSON text, or an instance."""
        if isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"speculative_config is not valid JSON ({exc}): give an object "
                                  'such as {"method": "ngram", "num_speculative_tokens": 4}') from None
        if not isinstance(value, Mapping):
            raise ConfigError(f"speculative_config must be an object, not {type(value).__name__}")
        d = dict(value)
        if "method" not in d and d.get("model"):
            d["method"] = "draft_model"  # vLLM: a model without a method is a draft model
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"speculative_config key(s) {', '.join(unknown)} are not supported "
                              f"by this engine; it reads {', '.join(sorted(known))}")
        if "method" not in d:
            raise ConfigError('speculative_config needs "method": one of ' + ", ".join(METHODS))
        if "num_speculative_tokens" not in d:
            if d["method"] != "suffix":
                raise ConfigError('speculative_config needs "num_speculative_tokens" (k, drafts per step)')
            d["num_speculative_tokens"] = d.get("suffix_decoding_max_tree_depth", 24)
        if d.get("model") is not None:
            d["model"] = os.fspath(d["model"])
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
