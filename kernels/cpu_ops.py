"""The CPU forward's element-wise kernels: the references' math in fewer, in-place ops.

At batch 1 a decoder layer's own compute is a few microseconds beside its four matmuls,
but the references (kernels/rmsnorm.py, rotary.py, kv_write.py, activation.py) spend
tens of small ops per layer on it, each with its dispatch and allocation. These do the
same arithmetic, element for element, with the step's invariants (cos/sin rows, valid K/V
slots, the attention plan) computed once per forward by the caller (engine/cpu_forward.py):

    rms_norm_cpu     the residual add in place into the layer's output, then torch's
                     rms_norm (its fp32 result is bit-identical to `rms_norm_ref`)
    rotary_cpu       q and k rotated together (they are adjacent in the fused qkv output)
    write_kv_cpu     the slots of the tokens that write (computed once per step)
    silu_and_mul_cpu silu in place of gate, times up

Other dtypes than fp32 take the references (they round between steps that these fuse).
`CpuOps` bundles them with the planned attention (kernels/cpu_attention.py), as
`KernelOps` bundles a backend's, so a profile can wrap each (benchmarks/forward_profile.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from inflight.kernels.activation import silu_and_mul_ref
from inflight.kernels.cpu_attention import paged_attention_planned
from inflight.kernels.kv_quant import is_quantized, quantize_kv
from inflight.kernels.rmsnorm import rms_norm_ref


def rms_norm_cpu(x: torch.Tensor, weight: torch.Tensor, eps: float,
                 residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`rms_norm_ref`; with a residual, x (a fresh layer output) takes the sum in place."""
    if x.dtype != torch.float32 or weight.dtype != torch.float32:
        return rms_norm_ref(x, weight, eps, residual)
    if residual is not None:
        x = x.add_(residual)
    return torch.rms_norm(x, (x.shape[-1],), weight, eps), x


def rope_rows(cos_sin: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's cos and sin [T, 1, D/2] from a [max_pos, D] cos|sin table (once per step)."""
    half = cos_sin.shape[-1] // 2
    cs = cos_sin[positions]
    return cs[:, None, :half], cs[:, None, half:]


def rotary_cpu(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Rotate x [T, H, D] in place (H: q's heads then k's, one view of the qkv output):
    x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin, as `rotary_ref` computes them."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    if x.dtype != torch.float32:
        x1f, x2f = x1.float(), x2.float()
        r1, r2 = x1f * cos - x2f * sin, x2f * cos + x1f * sin
    else:
        r1, r2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    x1.copy_(r1)
    x2.copy_(r2)


def write_kv_cpu(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slots: torch.Tensor, keep: torch.Tensor | None, k_scale: torch.Tensor | None = None,
                 v_scale: torch.Tensor | None = None) -> None:
    """`write_kv_ref` with the valid slots (and, when some are negative, the rows that
    write: `keep`) worked out once per step."""
    nb, bs, hkv, d = k_cache.shape
    if keep is not None:
        k, v = k[keep], v[keep]
    if not is_quantized(k_cache.dtype):
        k_cache.view(nb * bs, hkv, d).index_copy_(0, slots, k.to(k_cache.dtype))
        v_cache.view(nb * bs, hkv, d).index_copy_(0, slots, v.to(v_cache.dtype))
        return
    for x, cache, scales in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        values, s = quantize_kv(x, cache.dtype)
        # NOTE: through uint8 views: index_copy_ has no float8 kernel on CPU
        cache.view(torch.uint8).view(nb * bs, hkv, d).index_copy_(0, slots, values.view(torch.uint8))
        scales.view(nb * bs, hkv).index_copy_(0, slots, s)


def silu_and_mul_cpu(x: torch.Tensor) -> torch.Tensor:
    """`silu_and_mul_ref` of the fused gate|up output x [T, 2I] (overwrites its gate half)."""
    if x.dtype != torch.float32:
        return silu_and_mul_ref(x)
    inter = x.shape[-1] // 2
    gate = x[..., :inter]
    return F.silu(gate, inplace=True).mul_(x[..., inter:])


@dataclass(frozen=True)
class CpuOps:
    rms_norm: Callable = rms_norm_cpu
    rotary: Callable = rotary_cpu
    write_kv: Callable = write_kv_cpu
    paged_attention: Callable = paged_attention_planned
    silu_and_mul: Callable = silu_and_mul_cpu
