"""Verification: which drafts the target accepts, and the token after them, on the device.

For request i with drafts d_1..d_k (k may be 0) the target's forward gave k + 1 rows of
logits: row j scores the token after d_1..d_j. Out come 1..k+1 tokens, padded with -1:

    greedy:    t_j = argmax row j; accept the longest prefix with d_j == t_{j-1};
               emit d_1..d_a, then t_a (the target's own next token)
    sampling:  (Leviathan et al. 2023) accept d_j with probability min(1, p_j(d_j) / q_j(d_j));
               at the first rejection j emit a token from norm(max(0, p_j - q_j)), else,
               all accepted, a bonus token from p_{k+1}

p is the target's distribution after temperature, top-k and top-p (the plain sampler's);
q is the draft model's for its sampled drafts, or a point mass on d_j (n-gram, suffix):
then the test is u < p_j(d_j) and the residual is p_j without d_j. Either way each emitted
token is distributed exactly as plain sampling would draw it.

NOTE: randomness. A seeded request draws from its own generator, in this order: one
uniform per draft, then one vocab-sized exponential race for the token after them
(argmax(r / E), E ~ Exp(1), samples r exactly, unnormalised). With no drafts that is the
plain sampler's single race, so a request that stops speculating draws what it would have.
"""

from __future__ import annotations

import torch

from inflight.engine.sampler import SamplingBatch, apply_top_k_top_p


def greedy_verify(target: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """target [n, K+1] argmax ids, drafts [n, K] (-1 = none) -> emitted ids [n, K+1]."""
    K = drafts.shape[1]
    accepted = (target[:, :K] == drafts).int().cumprod(dim=1).sum(dim=1)  # [n]
    cols = torch.arange(K + 1, device=target.device)
    return torch.where(cols[None, :] <= accepted[:, None], target, -1)


def rejection_sample(probs: torch.Tensor, drafts: torch.Tensor, draft_probs: torch.Tensor | None,
                     uniform: torch.Tensor, race: torch.Tensor) -> torch.Tensor:
    """probs [n, K+1, V] (the target's), drafts [n, K] (-1 = none, only at the end of a row),
    draft_probs [n, K, V] or None (point masses), uniform [n, K] in [0, 1), race [n, V]
    Exp(1) -> emitted ids [n, K+1], -1 after the last."""
    n, K1, V = probs.shape
    K = K1 - 1
    if K == 0:
        return (probs[:, 0] / race).argmax(dim=1, keepdim=True)
    rows = torch.arange(n, device=probs.device)
    valid = drafts >= 0
    d = drafts.clamp(min=0)
    p_d = probs[:, :K].gather(2, d[..., None])[..., 0]
    q_d = torch.ones_like(p_d) if draft_probs is None else draft_probs.gather(2, d[..., None])[..., 0]
    accept = (uniform * q_d < p_d) & valid
    a = accept.int().cumprod(dim=1).sum(dim=1)  # drafts accepted, [n]
    p_a = probs[rows, a]
    at = a.clamp(max=K - 1)
    if draft_probs is None:
        q_a = torch.zeros_like(p_a).scatter_(1, d[rows, at][:, None], 1.0)
    else:
        q_a = draft_probs[rows, at]
    rejected = a < valid.sum(dim=1)
    weights = torch.where(rejected[:, None], (p_a - q_a).clamp(min=0.0), p_a)
    token = (weights / race).argmax(dim=1)
    cols = torch.arange(K1, device=probs.device)
    out = torch.where(cols[None, :] < a[:, None], torch.cat([d, d[:, :1]], dim=1), -1)
    out[rows, a] = token
    return out


def target_probs(logits: torch.Tensor, sampling: SamplingBatch) -> torch.Tensor:
    """[n, K+1, V] logits -> the distributions the plain sampler draws from (greedy rows
    get temperature 1: their probabilities are not used)."""
    n, K1, V = logits.shape
    temp = sampling.temperature
    scaled = logits / torch.where(temp == 0, torch.ones_like(temp), temp)[:, None, None]
    if sampling.top_k is not None or sampling.top_p is not None:
        rep = lambda t: None if t is None else t.repeat_interleave(K1)  # noqa: E731
        scaled = apply_top_k_top_p(scaled.reshape(n * K1, V), rep(sampling.top_k),
                                   rep(sampling.top_p)).view(n, K1, V)
    return scaled.softmax(dim=-1)


def verify(logits: torch.Tensor, drafts: torch.Tensor, num_drafts: list[int], sampling: SamplingBatch,
           default_generator: torch.Generator | None = None,
           draft_probs: torch.Tensor | None = None) -> torch.Tensor:
    """logits [n, K+1, V] fp32 of each request's rows (row j after j drafts; rows past a
    request's drafts are padding), drafts [n, K] -> emitted ids [n, K+1] (-1 padded).
    `num_drafts[i]`: request i's drafts (its uniforms drawn); `sampling.generators[i]`
    a seeded request's generator."""
    greedy = greedy_verify(logits.argmax(dim=-1), drafts)
    if sampling.all_greedy:
        return greedy
    n, K1, V = logits.shape
    probs = target_probs(logits, sampling)
    uniform = torch.rand((n, K1 - 1), device=logits.device, generator=default_generator)
    race = torch.empty((n, V), device=logits.device).exponential_(generator=default_generator)
    for i, gen in enumerate(sampling.generators):
        if gen is not None:
            k = num_drafts[i]
            if k:
                uniform[i, :k] = torch.rand(k, device=logits.device, generator=gen)
            race[i].exponential_(generator=gen)
    sampled = rejection_sample(probs, drafts, draft_probs, uniform, race)
    return torch.where((sampling.temperature == 0)[:, None], greedy, sampled)
