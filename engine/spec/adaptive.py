"""How many drafts a request should verify next: as many as pay for themselves.

A verification of d drafts costs `costs[d]` plain decode steps (costs[0] = 1): the curve
measured on the device at hand (engine/spec/verify_costs.py; on one CPU thread 1-2 drafts
cost little, 3 or more a step up), or 1 + c d for `draft_token_cost` c (`linear_costs`). With drafts accepted one
after another with probability q, it emits on average E(d) = 1 + q + ... + q^d tokens.
The request verifies the d <= k that maximises E(d) / costs[d]; d = 0 (no drafts) when
none beats plain decoding by MIN_GAIN (a gain within the estimate's noise is not worth a
verification).

q is estimated per request from its own verifications (accepted drafts and first
rejections, exponentially forgotten, with a uniform prior), so a request that copies
from its prompt drafts k tokens while one that paraphrases drafts few or none. A request
that stopped speculating forgets its evidence step by step, back to the prior, and so
tries again (its output may go back to copying).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

FORGET = 0.7  # weight of the evidence so far at each new verification (or idle step)
MIN_GAIN = 1.05


@dataclass(slots=True)
class DraftLength:
    hits: float = 0.0    # accepted drafts (forgetting)
    misses: float = 0.0  # first rejections (forgetting)

    @property
    def acceptance(self) -> float:
        return (self.hits + 1.0) / (self.hits + self.misses + 2.0)

    def choose(self, k: int, costs: Sequence[float]) -> int:
        """The number of drafts (<= k, < len(costs)) to verify next."""
        q = self.acceptance
        best, best_gain = 0, MIN_GAIN
        emitted, power = 1.0, 1.0
        for d in range(1, min(k, len(costs) - 1) + 1):
            power *= q
            emitted += power
            gain = emitted / costs[d]
            if gain > best_gain:
                best, best_gain = d, gain
        return best

    def observe(self, num_drafts: int, num_accepted: int) -> None:
        self.hits = FORGET * self.hits + num_accepted
        self.misses = FORGET * self.misses + (num_accepted < num_drafts)

    def idle(self) -> None:
        self.hits *= FORGET
        self.misses *= FORGET


def linear_costs(k: int, per_draft: float) -> list[float]:
    """costs[d] = 1 + per_draft * d for d = 0..k."""
    return [1.0 + per_draft * d for d in range(k + 1)]


def extended_costs(k: int, measured: Sequence[float], slope: float) -> list[float]:
    """A measured curve for d = 0..k, past its end on by `slope` a draft."""
    out = list(measured[:k + 1])
    while len(out) <= k:
        out.append(out[-1] + slope)
    return out
