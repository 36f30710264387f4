"""Each request verifies as many drafts as pay for themselves at its own acceptance rate."""

from __future__ import annotations

from inflight.engine.spec.adaptive import MIN_GAIN, DraftLength, extended_costs, linear_costs
from tests.engine.spec.cpu_curve import CPU_VERIFY_COST_SLOPE, CPU_VERIFY_COSTS


def expected_gain(q: float, d: int, cost: float) -> float:
    return sum(q ** i for i in range(d + 1)) / (1 + cost * d)


def test_the_length_chosen_maximises_tokens_per_cost():
    for hits, misses in ((0, 0), (20, 0), (3, 3), (0, 8), (6, 1)):
        dl = DraftLength(hits, misses)
        for cost in (0.0, 0.075, 0.2, 0.6):
            d = dl.choose(8, linear_costs(8, cost))
            gains = [expected_gain(dl.acceptance, i, cost) for i in range(9)]
            assert gains[d] == max(gains) or (d == 0 and max(gains) <= MIN_GAIN), (hits, misses, cost)
    assert DraftLength(50, 0).choose(8, linear_costs(8, 0.2)) == 8       # copying: all of k
    assert DraftLength(0, 10).choose(8, linear_costs(8, 0.2)) == 0       # never accepted: plain decoding
    assert DraftLength(0, 10).choose(8, linear_costs(8, 0.0)) == 8       # cost 0: always k (vLLM's way)


def test_evidence_moves_it_and_fades_when_idle():
    dl = DraftLength()
    for _ in range(5):
        dl.observe(4, 0)                                 # every first draft rejected
    assert dl.choose(8, linear_costs(8, 0.2)) == 0
    for _ in range(12):                                  # decoding plainly, it forgets ...
        dl.idle()
    assert dl.choose(8, linear_costs(8, 0.2)) > 0                         # ... and tries again
    for _ in range(5):
        dl.observe(8, 8)
    assert dl.choose(8, linear_costs(8, 0.2)) == 8


def test_the_measured_cpu_curve():
    """On CPU 1-2 drafts cost little and 3 or more a step up (cpu_curve.CPU_VERIFY_COSTS): a
    request that is right a third of the time verifies 1-2 drafts, one that copies all of
    k, one never right none; the curve goes on past its end at its last slope."""
    costs = extended_costs(24, CPU_VERIFY_COSTS, CPU_VERIFY_COST_SLOPE)
    assert len(costs) == 25 and costs[:len(CPU_VERIFY_COSTS)] == list(CPU_VERIFY_COSTS)
    assert abs(costs[24] - costs[16] - 8 * CPU_VERIFY_COST_SLOPE) < 1e-9 and costs[0] == 1.0
    assert extended_costs(4, CPU_VERIFY_COSTS, 1.0) == list(CPU_VERIFY_COSTS[:5])
    assert DraftLength(1, 2).choose(24, costs) in (1, 2)
    assert DraftLength(50, 0).choose(24, costs) == 24
    assert DraftLength(0, 10).choose(24, costs) == 0
    for hits, misses in ((0, 0), (3, 3), (6, 1), (20, 1)):
        dl = DraftLength(hits, misses)
        d = dl.choose(24, costs)
        gains = [sum(dl.acceptance ** i for i in range(j + 1)) / costs[j] for j in range(25)]
        assert gains[d] == max(gains) or (d == 0 and max(gains) <= MIN_GAIN), (hits, misses)
