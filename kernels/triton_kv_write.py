"""Triton KV write: the kernel behind `kv_write.write_kv_ref` (layout in kernels/kv_write.py).

One launch per layer: program (t, h) copies token t's key and value rows of KV head h into
slot_mapping[t]'s cache row, or does nothing when the slot is negative (a padded or
skipped token). grid = (T, Hkv). An 8-bit cache (QUANT: int8 or fp8) quantizes each row on
the way, with its own fp16 scale stored beside it (kernels/kv_quant.py: the same math).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from inflight.kernels.kv_quant import MIN_SCALE, QMAX, SCALE_DTYPE, is_quantized
from inflight.kernels.triton_util import check_device

NO_QUANT, INT8, FP8 = 0, 1, 2


@triton.jit
def _rint(x):
    """Round to the nearest integer, ties to even (torch.round)."""
    r = tl.floor(x + 0.5)
    odd = (r - 2.0 * tl.floor(r * 0.5)) != 0.0
    return tl.where(((r - x) == 0.5) & odd, r - 1.0, r)


@triton.jit
def _round_e4m3(y):
    """|y| <= 448 (fp32) -> the nearest e4m3 value (ties to even), still fp32: the cast to
    fp8 is then exact. NOTE: done here because the interpreter's fp32 -> fp8 cast rounds
    wrongly where the mantissa carries into the exponent (127.8 -> 64)."""
    bits = y.to(tl.int32, bitcast=True)
    lsb = (bits >> 20) & 1                         # the last of the 3 mantissa bits kept
    normal = ((bits + 0x7FFFF + lsb) & -1048576).to(tl.float32, bitcast=True)  # 0xFFF00000
    subnormal = _rint(y * 512.0) * 0.001953125     # below 2^-6: a fixed grid of 2^-9
    return tl.where(tl.abs(y) < 0.015625, subnormal, normal)


@triton.jit
def _quantize_row(x, d_ok, QUANT: tl.constexpr, QMAX: tl.constexpr, MIN_SCALE: tl.constexpr):
    """A row (fp32) -> (its 8-bit values as fp32, its fp16 scale), as kv_quant.quantize_kv."""
    amax = tl.max(tl.where(d_ok, tl.abs(x), 0.0), axis=0)
    scale = tl.maximum(amax / QMAX, MIN_SCALE).to(tl.float16)
    y = x / scale.to(tl.float32)
    if QUANT == 1:
        y = _rint(y)
    y = tl.minimum(tl.maximum(y, -QMAX), QMAX)
    if QUANT == 2:
        y = _round_e4m3(y)
    return y, scale


@triton.jit
def _write_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
                     k_scale_ptr, v_scale_ptr,
                     stride_kt, stride_kh, stride_vt, stride_vh,
                     stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
                     stride_sb, stride_ss,
                     BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                     QUANT: tl.constexpr, QMAX: tl.constexpr, MIN_SCALE: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    slot = tl.load(slot_mapping_ptr + t).to(tl.int64)
    if slot < 0:
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = d < HEAD_DIM
    k = tl.load(k_ptr + t * stride_kt + h * stride_kh + d, mask=d_ok, other=0.0)
    v = tl.load(v_ptr + t * stride_vt + h * stride_vh + d, mask=d_ok, other=0.0)
    if QUANT != 0:
        k, k_scale = _quantize_row(k.to(tl.float32), d_ok, QUANT, QMAX, MIN_SCALE)
        v, v_scale = _quantize_row(v.to(tl.float32), d_ok, QUANT, QMAX, MIN_SCALE)
        s = block * stride_sb + offset * stride_ss + h  # scales: [num_blocks, block_size, Hkv]
        tl.store(k_scale_ptr + s, k_scale)
        tl.store(v_scale_ptr + s, v_scale)
    tl.store(k_cache_ptr + block * stride_kcb + offset * stride_kcs + h * stride_kch + d,
             k.to(k_cache_ptr.dtype.element_ty), mask=d_ok)
    tl.store(v_cache_ptr + block * stride_vcb + offset * stride_vcs + h * stride_vch + d,
             v.to(v_cache_ptr.dtype.element_ty), mask=d_ok)


def write_kv_triton(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    slot_mapping: torch.Tensor, k_scale: torch.Tensor | None = None,
                    v_scale: torch.Tensor | None = None) -> None:
    """Same contract as `write_kv_ref`; k and v may be strided views (e.g. of a fused qkv)."""
    T, Hkv, D = k.shape
    _, block_size, cache_heads, cache_dim = k_cache.shape
    assert v.shape == k.shape and v_cache.shape == k_cache.shape, (k.shape, v.shape, k_cache.shape, v_cache.shape)
    assert (cache_heads, cache_dim) == (Hkv, D), f"k {tuple(k.shape)} does not fit cache {tuple(k_cache.shape)}"
    assert k.stride(2) == 1 and v.stride(2) == 1 and k_cache.stride(3) == 1 and v_cache.stride(3) == 1
    assert slot_mapping.shape == (T,) and slot_mapping.is_contiguous()
    assert not slot_mapping.dtype.is_floating_point
    quant = is_quantized(k_cache.dtype)
    if quant:
        assert k_cache.dtype == v_cache.dtype and k_scale is not None and v_scale is not None
        assert k_scale.shape == v_scale.shape == k_cache.shape[:3], (k_scale.shape, k_cache.shape)
        assert k_scale.dtype == v_scale.dtype == SCALE_DTYPE and k_scale.is_contiguous() and v_scale.is_contiguous()
        check_device(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    else:
        check_device(k, v, k_cache, v_cache, slot_mapping)
        k_scale = v_scale = slot_mapping  # unused
    if T == 0:
        return
    _write_kv_kernel[(T, Hkv)](
        k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_size * Hkv, Hkv,
        BLOCK_SIZE=block_size, HEAD_DIM=D, HEAD_DIM_PAD=triton.next_power_of_2(D),
        QUANT=(FP8 if k_cache.dtype == torch.float8_e4m3fn else INT8) if quant else NO_QUANT,
        QMAX=QMAX.get(k_cache.dtype, 1.0), MIN_SCALE=MIN_SCALE, num_warps=1)
