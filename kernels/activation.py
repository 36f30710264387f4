"""SwiGLU: silu(gate) * up (and GeGLU), from the fused gate|up projection.

    x [T, 2 * I]  (gate in [:, :I], up in [:, I:])  ->  [T, I]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    inter = x.shape[-1] // 2
    return (F.silu(x[..., :inter].float()) * x[..., inter:].float()).to(x.dtype)


def gelu_tanh_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """GeGLU with tanh-approximated GELU (Gemma: `gelu_pytorch_tanh`), same layout."""
    inter = x.shape[-1] // 2
    return (F.gelu(x[..., :inter].float(), approximate="tanh") * x[..., inter:].float()).to(x.dtype)
