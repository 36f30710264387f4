"""The rejection sampler keeps the target's distribution (as vLLM's test_rejection_sampler):
on a vocabulary of 8, many rows of the same verification, the emitted tokens' frequencies
match the target's probabilities at every position, for point-mass drafts (n-gram, suffix)
and for drafts sampled from a draft model's own distribution."""

from __future__ import annotations

import pytest
import torch

from inflight.engine.sampler import SamplingBatch
from inflight.engine.spec.rejection import greedy_verify, rejection_sample, verify

V, K, ROWS = 8, 3, 40_000
TOL = 0.02  # total variation; the sampling noise at 40k rows is ~0.005


def tv(counts: torch.Tensor, probs: torch.Tensor) -> float:
    return 0.5 * (counts / counts.sum() - probs).abs().sum().item()


def dists(gen, n=K + 1, sharp=1.5):
    return torch.softmax(sharp * torch.randn(n, V, generator=gen), dim=-1)


def run(p, drafts, q=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    probs = p[None].expand(ROWS, K + 1, V)
    uniform = torch.rand(ROWS, K, generator=gen)
    race = torch.empty(ROWS, V).exponential_(generator=gen)
    return rejection_sample(probs, drafts, None if q is None else q[None].expand(ROWS, K, V),
                            uniform, race)


def check_positions(out, drafts, p):
    """Position 0 is distributed as p[0]; position j given drafts 0..j-1 accepted, as p[j]."""
    reached = torch.ones(ROWS, dtype=torch.bool)
    for j in range(K + 1):
        sel = out[reached, j]
        assert (sel >= 0).all()
        assert tv(torch.bincount(sel, minlength=V).double(), p[j].double()) < TOL, j
        if j < K:
            reached &= out[:, j] == drafts[:, j]
            if reached.sum() < 2000:
                break


@pytest.mark.parametrize("kind", ["point-mass", "draft-model"])
def test_rejection_sampling_keeps_the_target_distribution(kind):
    gen = torch.Generator().manual_seed(7)
    p = dists(gen)
    if kind == "point-mass":
        q = None
        drafts = torch.tensor([int(p[j].argmax()) for j in range(K)]).expand(ROWS, K)
    else:
        q = dists(gen, K, sharp=1.0)
        drafts = torch.stack([torch.multinomial(q[j], ROWS, replacement=True, generator=gen)
                              for j in range(K)], dim=1)
    out = run(p, drafts, q)
    check_positions(out, drafts, p)
    emitted = (out >= 0).sum(dim=1)
    assert emitted.min() >= 1 and emitted.max() == K + 1   # some rows accept everything


def test_the_check_would_catch_a_sampler_without_the_residual():
    """Resampling from p after a rejection (instead of max(0, p - q)) over-weights the
    draft token: the first position's distance to p is far above the tolerance."""
    gen = torch.Generator().manual_seed(7)
    p = dists(gen)
    d = int(p[0].argsort()[-2])
    naive = p[0][d] * torch.nn.functional.one_hot(torch.tensor(d), V) + (1 - p[0][d]) * p[0]
    assert 0.5 * (naive - p[0]).abs().sum().item() > 3 * TOL


def test_greedy_accepts_the_longest_matching_prefix():
    target = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8], [5, 6, 7, 8], [9, 9, 9, 9]])
    drafts = torch.tensor([[5, 6, 7], [5, 0, 7], [1, 6, 7], [9, -1, -1]])
    assert greedy_verify(target, drafts).tolist() == [
        [5, 6, 7, 8], [5, 6, -1, -1], [5, -1, -1, -1], [9, 9, -1, -1]]


def test_seeded_rows_draw_from_their_own_generators():
    """The same seed gives the same tokens whatever the other rows are; a row without
    drafts draws what the plain sampler would (one vocabulary-sized race)."""
    from inflight.engine.sampler import sample

    logits = torch.randn(3, K + 1, V, generator=torch.Generator().manual_seed(3))
    drafts = torch.tensor([[1, 2, 3], [4, -1, -1], [-1, -1, -1]])
    temp = torch.tensor([0.8, 0.8, 0.8])

    def once(seed_rows, other):
        gens = [torch.Generator().manual_seed(11), None, torch.Generator().manual_seed(12)]
        batch = SamplingBatch(temp, None, None, gens, False)
        default = torch.Generator().manual_seed(other)
        return verify(logits, drafts, [3, 1, 0], batch, default)

    a, b = once(None, 1), once(None, 2)
    assert a[0].tolist() == b[0].tolist() and a[2].tolist() == b[2].tolist()
    plain = sample(logits[2:, 0], SamplingBatch(temp[2:], None, None, [torch.Generator().manual_seed(12)], False))
    assert a[2, 0].item() == plain.item() and (a[2, 1:] == -1).all()
