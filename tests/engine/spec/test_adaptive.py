"""Each request verifies as many drafts as pay for themselves at its own acceptance rate."""

from __future__ import annotations

from inflight.engine.spec.adaptive import MIN_GAIN, DraftLength


def expected_gain(q: float, d: int, cost: float) -> float:
    return sum(q ** i for i in range(d + 1)) / (1 + cost * d)


def test_the_length_chosen_maximises_tokens_per_cost():
    for hits, misses in ((0, 0), (20, 0), (3, 3), (0, 8), (6, 1)):
        dl = DraftLength(hits, misses)
        for cost in (0.0, 0.075, 0.2, 0.6):
            d = dl.choose(8, cost)
            gains = [expected_gain(dl.acceptance, i, cost) for i in range(9)]
            assert gains[d] == max(gains) or (d == 0 and max(gains) <= MIN_GAIN), (hits, misses, cost)
    assert DraftLength(50, 0).choose(8, 0.2) == 8       # copying: all of k
    assert DraftLength(0, 10).choose(8, 0.2) == 0       # never accepted: plain decoding
    assert DraftLength(0, 10).choose(8, 0.0) == 8       # cost 0: always k (vLLM's way)


def test_evidence_moves_it_and_fades_when_idle():
    dl = DraftLength()
    for _ in range(5):
        dl.observe(4, 0)                                 # every first draft rejected
    assert dl.choose(8, 0.2) == 0
    for _ in range(12):                                  # decoding plainly, it forgets ...
        dl.idle()
    assert dl.choose(8, 0.2) > 0                         # ... and tries again
    for _ in range(5):
        dl.observe(8, 8)
    assert dl.choose(8, 0.2) == 8
