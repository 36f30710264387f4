"""How many drafts a request should verify next: as many as pay for themselves.

Each draft token makes the verification forward dearer by a share `c` of a plain decode
step (`draft_token_cost`: about 0.12 on one CPU thread, far less on a GPU at small batch). With drafts accepted one
after another with probability q, a verification of d drafts emits on average
E(d) = 1 + q + ... + q^d tokens for a cost of 1 + c d. The request verifies the d <= k
that maximises E(d) / (1 + c d); d = 0 (no drafts) when none beats plain decoding by
MIN_GAIN (a gain within the estimate's noise is not worth a verification).

q is estimated per request from its own verifications (accepted drafts and first
rejections, exponentially forgotten, with a uniform prior), so a request that copies
from its prompt drafts k tokens while one that paraphrases drafts few or none. A request
that stopped speculating forgets its evidence step by step, back to the prior, and so
tries again (its output may go back to copying).
"""

from __future__ import annotations

from dataclasses import dataclass

FORGET = 0.7  # weight of the evidence so far at each new verification (or idle step)
MIN_GAIN = 1.05


@dataclass(slots=True)
class DraftLength:
    hits: float = 0.0    # accepted drafts (forgetting)
    misses: float = 0.0  # first rejections (forgetting)

    @property
    def acceptance(self) -> float:
        return (self.hits + 1.0) / (self.hits + self.misses + 2.0)

    def choose(self, k: int, cost: float) -> int:
        q = self.acceptance
        best, best_gain = 0, MIN_GAIN
        emitted, power = 1.0, 1.0
        for d in range(1, k + 1):
            power *= q
            emitted += power
            gain = emitted / (1.0 + cost * d)
            if gain > best_gain:
                best, best_gain = d, gain
        return best

    def observe(self, num_drafts: int, num_accepted: int) -> None:
        self.hits = FORGET * self.hits + num_accepted
        self.misses = FORGET * self.misses + (num_accepted < num_drafts)

    def idle(self) -> None:
        self.hits *= FORGET
        self.misses *= FORGET
