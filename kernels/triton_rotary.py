"""Triton rotary embedding (rotate-half / NeoX layout): the kernel behind `rotary.rotary_ref`.

In place on q [T, Hq, D] and k [T, Hkv, D] (strided views of a fused qkv are fine): program
t reads cos | sin of positions[t] once and rotates all of token t's query and key heads,
in fp32, stored back in the input dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from inflight.kernels.triton_util import check_device


@triton.jit
def _rotate_heads(x_ptr, stride_h, num_heads, cos, sin,
                  HALF: tl.constexpr, HALF_PAD: tl.constexpr, HEADS_PAD: tl.constexpr):
    h = tl.arange(0, HEADS_PAD)
    i = tl.arange(0, HALF_PAD)
    ok = (h[:, None] < num_heads) & (i[None, :] < HALF)
    p1 = x_ptr + h[:, None] * stride_h + i[None, :]
    x1 = tl.load(p1, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(p1 + HALF, mask=ok, other=0.0).to(tl.float32)
    tl.store(p1, (x1 * cos[None, :] - x2 * sin[None, :]).to(x_ptr.dtype.element_ty), mask=ok)
    tl.store(p1 + HALF, (x2 * cos[None, :] + x1 * sin[None, :]).to(x_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _rotary_kernel(q_ptr, k_ptr, positions_ptr, cos_sin_ptr, num_q_heads, num_k_heads,
                   stride_qt, stride_qh, stride_kt, stride_kh, stride_cs,
                   HALF: tl.constexpr, HALF_PAD: tl.constexpr,
                   Q_HEADS_PAD: tl.constexpr, K_HEADS_PAD: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + t).to(tl.int64)
    i = tl.arange(0, HALF_PAD)
    cos = tl.load(cos_sin_ptr + pos * stride_cs + i, mask=i < HALF, other=0.0).to(tl.float32)
    sin = tl.load(cos_sin_ptr + pos * stride_cs + HALF + i, mask=i < HALF, other=0.0).to(tl.float32)
    _rotate_heads(q_ptr + t * stride_qt, stride_qh, num_q_heads, cos, sin, HALF, HALF_PAD, Q_HEADS_PAD)
    _rotate_heads(k_ptr + t * stride_kt, stride_kh, num_k_heads, cos, sin, HALF, HALF_PAD, K_HEADS_PAD)


def rotary_triton(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor) -> None:
    """Same contract as `rotary_ref`: rotates q and k in place."""
    T, Hq, D = q.shape
    assert k.dim() == 3 and k.shape[0] == T and k.shape[2] == D, (q.shape, k.shape)
    assert D % 2 == 0 and cos_sin.dim() == 2 and cos_sin.shape[1] == D, (D, cos_sin.shape)
    assert q.stride(2) == 1 and k.stride(2) == 1 and cos_sin.stride(1) == 1
    assert positions.shape == (T,) and positions.is_contiguous()
    check_device(q, k, positions, cos_sin)
    if T == 0:
        return
    half = D // 2
    _rotary_kernel[(T,)](q, k, positions, cos_sin, Hq, k.shape[1],
                         q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos_sin.stride(0),
                         HALF=half, HALF_PAD=triton.next_power_of_2(half),
                         Q_HEADS_PAD=triton.next_power_of_2(Hq),
                         K_HEADS_PAD=triton.next_power_of_2(k.shape[1]), num_warps=4)
