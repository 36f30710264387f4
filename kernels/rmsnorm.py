"""RMSNorm with an optional fused residual add.

    rms_norm(x, weight, eps)            -> (norm(x), x)
    rms_norm(x, weight, eps, residual)  -> (norm(x + residual), x + residual)

The second value is the new residual stream, so a decoder layer is
`h, res = rms_norm(attn_out, w, eps, res)`. Math in fp32, outputs in x's dtype.
"""

from __future__ import annotations

import torch


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float,
                 residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    if residual is not None:
        x = x + residual
    xf = x.float()
    var = xf.pow(2).mean(dim=-1, keepdim=True)
    out = (xf * torch.rsqrt(var + eps)).to(x.dtype) * weight
    return out.to(x.dtype), x
