"""Sample one token per row from fp32 logits, on tensors, for a batch of mixed settings.

Greedy rows take the argmax. The others: temperature, then top-k and top-p masks (on one
sort, only when some row asks), then the exponential race `argmax(p / E)`, E ~ Exp(1),
which draws exactly from p. NOTE: a seeded request draws its E from its own generator, one
vocab-sized draw per token, so its output does not depend on the rest of the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inflight.engine.logits_processors import apply_min_p


@dataclass
class SamplingBatch:
    """Per-row settings of one step, built by the model runner."""

    temperature: torch.Tensor          # [S] fp32, 0 = greedy
    top_k: torch.Tensor | None         # [S] int64, vocab size = off; None when no row uses it
    top_p: torch.Tensor | None         # [S] fp32, 1 = off; None when no row uses it
    generators: list[torch.Generator | None]
    all_greedy: bool
    min_p: torch.Tensor | None = None  # [S] fp32, 0 = off; None when no row uses it


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None,
                      top_p: torch.Tensor | None) -> torch.Tensor:
    """Mask (to -inf) every token outside each row's top-k and top-p nucleus. At least the
    most likely token always survives."""
    sorted_logits, idx = logits.sort(dim=-1, descending=True)
    mask = torch.zeros_like(sorted_logits, dtype=torch.bool)
    if top_k is not None:
        ranks = torch.arange(logits.shape[-1], device=logits.device)
        mask |= ranks[None, :] >= top_k[:, None]
    if top_p is not None:
        probs = sorted_logits.masked_fill(mask, float("-inf")).softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # mass of strictly better tokens
        mask |= mass_before >= top_p[:, None]
    mask[:, 0] = False
    sorted_logits.masked_fill_(mask, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, idx, sorted_logits)


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """argmax over the last dim (the first maximal index, as argmax). NOTE: on CPU torch's
    argmax over many rows runs ~4x slower than max's indices (7 vs 1.7 ms for 64 x 49152,
    one thread), which return the same first maximal index; CUDA keeps argmax."""
    return x.max(dim=-1).indices if x.device.type == "cpu" else x.argmax(dim=-1)


def sample(logits: torch.Tensor, batch: SamplingBatch,
           default_generator: torch.Generator | None = None) -> torch.Tensor:
    """logits [S, V] fp32 -> token ids [S] int64."""
    greedy = argmax_rows(logits)
    if batch.all_greedy:
        return greedy
    temp = batch.temperature
    is_greedy = temp == 0
    scaled = logits / torch.where(is_greedy, torch.ones_like(temp), temp)[:, None]
    if batch.min_p is not None:
        scaled = apply_min_p(scaled, batch.min_p)
    if batch.top_k is not None or batch.top_p is not None:
        scaled = apply_top_k_top_p(scaled, batch.top_k, batch.top_p)
    probs = scaled.softmax(dim=-1)
    race = torch.empty_like(probs)
    race.exponential_(generator=default_generator)
    for row, gen in enumerate(batch.generators):
        if gen is not None:
            race[row].exponential_(generator=gen)
    sampled = argmax_rows(probs / race)
    return torch.where(is_greedy, greedy, sampled)
