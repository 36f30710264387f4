"""Rotary position embedding, Hugging Face Llama ("rotate half", NeoX) layout.

    q [T, Hq, D], k [T, Hkv, D]      modified in place
    positions [T] int64              absolute position of each token
    cos_sin [max_pos, D]             cos in [:, :D/2], sin in [:, D/2:]  (see rope_cos_sin)

x' = x * cos + rotate_half(x) * sin, where rotate_half(x) = cat(-x2, x1).
"""

from __future__ import annotations

import torch


def rope_cos_sin(head_dim: int, max_pos: int, theta: float, device=None,
                 inv_freq: torch.Tensor | None = None) -> torch.Tensor:
    """The [max_pos, head_dim] cache of cos | sin halves, fp32. `inv_freq` overrides the
    default 1 / theta^(2i/D) (for scaled-RoPE checkpoints)."""
    if inv_freq is None:
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device)
                                    / head_dim))
    t = torch.arange(max_pos, dtype=torch.float32, device=device)
    freqs = torch.outer(t, inv_freq.to(device=device, dtype=torch.float32))  # [max_pos, D/2]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def rotary_ref(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor) -> None:
    half = q.shape[-1] // 2
    cs = cos_sin[positions]  # [T, D]
    cos, sin = cs[:, None, :half], cs[:, None, half:]
    q.copy_(_rotate(q, cos, sin))
    k.copy_(_rotate(k, cos, sin))
