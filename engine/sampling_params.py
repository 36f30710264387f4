"""Per-request sampling parameters (the engine's own; the service converts the wire model)."""

from __future__ import annotations

from dataclasses import dataclass

from inflight.engine.logprobs import MAX_LOGPROBS
from inflight.schemas.errors import InflightError


class SamplingParamsError(InflightError, ValueError):
    """A sampling parameter has a value the engine cannot use."""


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request (vLLM conventions).

    temperature 0 = greedy; top_k <= 0 = off; top_p 1 = off; `seed` makes sampling
    reproducible whatever else is in the batch; `stop` strings are not included in the
    output text; EOS ends generation unless `ignore_eos`.

    `logprobs`: None = off; n = the log-probability of each sampled token plus the n most
    likely alternatives (0..20). `prompt_logprobs`: the same for each prompt token given the
    ones before it (the first has none); such a request recomputes its whole prompt instead
    of taking prefix-cache hits. Both are the model's raw logprobs (engine/logprobs.py).
    """

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop or ()))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids or ()))
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise SamplingParamsError(f"max_tokens={self.max_tokens!r} must be an integer >= 1")
        if not 0.0 <= self.temperature <= 100.0:
            raise SamplingParamsError(f"temperature={self.temperature} must be in [0, 100] "
                                      "(0 = greedy)")
        if not 0.0 < self.top_p <= 1.0:
            raise SamplingParamsError(f"top_p={self.top_p} must be in (0, 1] (1 = off)")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise SamplingParamsError(f"top_k={self.top_k!r} must be -1, 0 (off) or >= 1")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise SamplingParamsError(f"seed={self.seed} must be in [0, 2**63)")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise SamplingParamsError(f"stop={self.stop!r}: every stop string must be non-empty")
        if any(t < 0 for t in self.stop_token_ids):
            raise SamplingParamsError(f"stop_token_ids={self.stop_token_ids!r} must be >= 0")
        for name in ("logprobs", "prompt_logprobs"):
            n = getattr(self, name)
            if n is not None and (not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_LOGPROBS):
                raise SamplingParamsError(f"{name}={n!r} must be None (off) or an integer in "
                                          f"[0, {MAX_LOGPROBS}] (alternatives per token)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def uses_top_k(self) -> bool:
        return self.top_k >= 1

    @property
    def uses_top_p(self) -> bool:
        return self.top_p < 1.0
