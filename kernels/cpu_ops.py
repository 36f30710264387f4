"""The CPU forward's kernels: the references' math in fewer ops, or in one C++ call each.

At batch 1 a decoder layer's own compute is a few microseconds beside its four matmuls,
but the references (kernels/rmsnorm.py, rotary.py, kv_write.py, activation.py) spend
tens of small ops per layer on it, each with its dispatch and allocation, and inside a
forward every one of them runs with cold caches (the weights streaming through evict the
small ops' data and the dispatcher's code). With the step's invariants (cos/sin rows, K/V
slots, the attention plan) computed once per forward by the caller (engine/cpu_forward.py):

    torch ops (TORCH_CPU_OPS; any dtype, any KV cache)
    rms_norm_cpu      the residual add in place into the layer's output, then torch's
                      rms_norm (its fp32 result is bit-identical to `rms_norm_ref`)
    rope_kv_cpu       q and k rotated together (adjacent in the fused qkv output), then
                      K/V written at the step's valid slots
    paged_attention_planned (kernels/cpu_attention.py)
    silu_and_mul_cpu  silu in place of gate, times up

    one C++ call each (NATIVE_CPU_OPS, kernels/csrc/cpu_decoder_ops.cpp), for fp32 rows
    and an fp32 KV cache, the torch ops otherwise: rms_norm (residual add included),
    rope_write_kv, decode_attention (an all-decode step: each sequence's keys read in
    place through its block table, no gather), silu_mul

Other dtypes than fp32 take the references (they round between steps that these fuse).
`CpuOps` bundles one set, as `KernelOps` bundles a backend's, so a profile can wrap each
(benchmarks/forward_profile.py); `cpu_ops()` picks the native set where it builds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from inflight.kernels.activation import silu_and_mul_ref
from inflight.kernels.cpu_attention import AttentionPlan, paged_attention_planned
from inflight.kernels.cpu_native import native
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


@dataclass(frozen=True)
class StepRope:
    """One RoPE table's rows for the step's tokens (made once per step: `rope_rows`)."""

    table: torch.Tensor       # [max_pos, D] cos | sin
    positions: torch.Tensor   # [T] int64
    cos: torch.Tensor         # [T, 1, D/2]
    sin: torch.Tensor


def rope_rows(cos_sin: torch.Tensor, positions: torch.Tensor) -> StepRope:
    half = cos_sin.shape[-1] // 2
    cs = cos_sin[positions]
    return StepRope(cos_sin, positions, cs[:, None, :half], cs[:, None, half:])


@dataclass(frozen=True)
class StepSlots:
    """Where the step's K/V go: every token's slot (negative: none), and the valid ones."""

    mapping: torch.Tensor        # [T] int64
    valid: torch.Tensor          # [T'] int64, the non-negative slots
    keep: torch.Tensor | None    # [T] bool, when some slots are negative


def step_slots(slot_mapping: torch.Tensor) -> StepSlots:
    mapping = slot_mapping.long()
    if bool((mapping < 0).any()):
        keep = mapping >= 0
        return StepSlots(mapping, mapping[keep], keep)
    return StepSlots(mapping, mapping, None)


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


def qkv_views(qkv: torch.Tensor, heads: tuple[int, int, int]):
    """q [T, H, D], k and v [T, Hkv, D]: views of the fused qkv rows."""
    H, Hkv, D = heads
    T = qkv.shape[0]
    return (qkv[:, :H * D].view(T, H, D), qkv[:, H * D:(H + Hkv) * D].view(T, Hkv, D),
            qkv[:, (H + Hkv) * D:].view(T, Hkv, D))


def rope_kv_cpu(qkv: torch.Tensor, heads: tuple[int, int, int], rope: StepRope, slots: StepSlots,
                k_cache: torch.Tensor, v_cache: torch.Tensor, *scales: torch.Tensor):
    """q and k rotated in place in the fused qkv rows, k and v written to the cache ->
    the views (q, k, v)."""
    H, Hkv, D = heads
    q, k, v = qkv_views(qkv, heads)
    rotary_cpu(qkv[:, :(H + Hkv) * D].view(qkv.shape[0], H + Hkv, D), rope.cos, rope.sin)
    write_kv_cpu(k, v, k_cache, v_cache, slots.valid, slots.keep, *scales)
    return q, k, v


def _native_rows(*ts: torch.Tensor) -> bool:
    return all(t.dtype == torch.float32 and t.dim() == 2 and t.stride(-1) == 1 for t in ts)


def rms_norm_native(x, weight, eps, residual=None):
    if not _native_rows(x) or weight.dtype != torch.float32 or (residual is not None and not _native_rows(residual)):
        return rms_norm_cpu(x, weight, eps, residual)
    return native().rms_norm(x, residual, weight, eps), x


def rope_kv_native(qkv, heads, rope, slots, k_cache, v_cache, *scales):
    if scales or not _native_rows(qkv) or k_cache.dtype != torch.float32:
        return rope_kv_cpu(qkv, heads, rope, slots, k_cache, v_cache, *scales)
    native().rope_write_kv(qkv, rope.table, rope.positions, *heads, k_cache, v_cache, slots.mapping)
    return qkv_views(qkv, heads)


def paged_attention_native(q, k_cache, v_cache, plan: AttentionPlan, scale, k_scale=None, v_scale=None):
    if (not plan.all_decode or k_scale is not None or q.dtype != torch.float32
            or k_cache.dtype != torch.float32):
        return paged_attention_planned(q, k_cache, v_cache, plan, scale, k_scale, v_scale)
    return native().decode_attention(q, k_cache, v_cache, plan.block_tables, plan.seq_lens, scale,
                                     plan.window or -1)


def silu_and_mul_native(x):
    return native().silu_mul(x) if _native_rows(x) else silu_and_mul_cpu(x)


def silu_and_mul_cpu(x: torch.Tensor) -> torch.Tensor:
    """`silu_and_mul_ref` of the fused gate|up output x [T, 2I] (overwrites its gate half)."""
    if x.dtype != torch.float32:
        return silu_and_mul_ref(x)
    inter = x.shape[-1] // 2
    gate = x[..., :inter]
    return F.silu(gate, inplace=True).mul_(x[..., inter:])


@dataclass(frozen=True)
class CpuOps:
    rms_norm: Callable
    rope_kv: Callable
    paged_attention: Callable
    silu_and_mul: Callable


TORCH_CPU_OPS = CpuOps(rms_norm_cpu, rope_kv_cpu, paged_attention_planned, silu_and_mul_cpu)
NATIVE_CPU_OPS = CpuOps(rms_norm_native, rope_kv_native, paged_attention_native, silu_and_mul_native)


def cpu_ops() -> CpuOps:
    """The C++ set where it builds here (kernels/cpu_native.py), else the torch one."""
    return NATIVE_CPU_OPS if native() is not None else TORCH_CPU_OPS
