"""Triton KV write: the kernel behind `kv_write.write_kv_ref` (layout in kernels/kv_write.py).

One launch per layer: program (t, h) copies token t's key and value rows of KV head h into
slot_mapping[t]'s cache row, or does nothing when the slot is negative (a padded or
skipped token). grid = (T, Hkv).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from inflight.kernels.triton_util import check_device


@triton.jit
def _write_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
                     stride_kt, stride_kh, stride_vt, stride_vh,
                     stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
                     BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    slot = tl.load(slot_mapping_ptr + t).to(tl.int64)
    if slot < 0:
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = d < HEAD_DIM
    k = tl.load(k_ptr + t * stride_kt + h * stride_kh + d, mask=d_ok)
    v = tl.load(v_ptr + t * stride_vt + h * stride_vh + d, mask=d_ok)
    tl.store(k_cache_ptr + block * stride_kcb + offset * stride_kcs + h * stride_kch + d,
             k.to(k_cache_ptr.dtype.element_ty), mask=d_ok)
    tl.store(v_cache_ptr + block * stride_vcb + offset * stride_vcs + h * stride_vch + d,
             v.to(v_cache_ptr.dtype.element_ty), mask=d_ok)


def write_kv_triton(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    slot_mapping: torch.Tensor) -> None:
    """Same contract as `write_kv_ref`; k and v may be strided views (e.g. of a fused qkv)."""
    T, Hkv, D = k.shape
    _, block_size, cache_heads, cache_dim = k_cache.shape
    assert v.shape == k.shape and v_cache.shape == k_cache.shape, (k.shape, v.shape, k_cache.shape, v_cache.shape)
    assert (cache_heads, cache_dim) == (Hkv, D), f"k {tuple(k.shape)} does not fit cache {tuple(k_cache.shape)}"
    assert k.stride(2) == 1 and v.stride(2) == 1 and k_cache.stride(3) == 1 and v_cache.stride(3) == 1
    assert slot_mapping.shape == (T,) and slot_mapping.is_contiguous()
    assert not slot_mapping.dtype.is_floating_point
    check_device(k, v, k_cache, v_cache, slot_mapping)
    if T == 0:
        return
    _write_kv_kernel[(T, Hkv)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        BLOCK_SIZE=block_size, HEAD_DIM=D, HEAD_DIM_PAD=triton.next_power_of_2(D), num_warps=1)
