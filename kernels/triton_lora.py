"""Triton LoRA for a batch that mixes adapters (Punica's BGMV shape): the kernels behind
`kernels/lora.py`'s `lora_add_ref`.

Two launches, no host work (a CUDA graph can hold them):

    shrink   grid (T, C / BLOCK_C):  xa[t, c]  = sum_k x[t, k] * a[slot_t, c, k]     (fp32)
    expand   grid (T, N / BLOCK_N):  y[t, n]  += sum_c xa[t, c] * b[slot_t, c, n]

A token of slot -1 (the base model) returns at once in both. Each program reads its token's
slot from `slots`, so one launch serves any mix of adapters; the products are
broadcast-multiply-sums in fp32 (the ranks are small: this is memory-bound, no tensor cores).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from inflight.kernels.lora import check_lora_shapes
from inflight.kernels.triton_util import check_device


@triton.jit
def _lora_shrink_kernel(xa_ptr, x_ptr, a_ptr, slots_ptr, K, C,
                        stride_x, stride_as, stride_ac, stride_xa,
                        BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + t).to(tl.int64)
    if slot < 0:
        return
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = cols < C
    acc = tl.zeros((BLOCK_C,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        x = tl.load(x_ptr + t * stride_x + ks, mask=k_ok, other=0.0).to(tl.float32)
        a = tl.load(a_ptr + slot * stride_as + cols[:, None] * stride_ac + ks[None, :],
                    mask=c_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(a * x[None, :], axis=1)
    tl.store(xa_ptr + t * stride_xa + cols, acc, mask=c_ok)


@triton.jit
def _lora_expand_kernel(y_ptr, xa_ptr, b_ptr, slots_ptr, C, N,
                        stride_y, stride_xa, stride_bs, stride_bc,
                        BLOCK_C: tl.constexpr, BLOCK_N: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + t).to(tl.int64)
    if slot < 0:
        return
    ns = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = ns < N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for c0 in range(0, C, BLOCK_C):
        cs = c0 + tl.arange(0, BLOCK_C)
        c_ok = cs < C
        xa = tl.load(xa_ptr + t * stride_xa + cs, mask=c_ok, other=0.0)
        b = tl.load(b_ptr + slot * stride_bs + cs[:, None] * stride_bc + ns[None, :],
                    mask=c_ok[:, None] & n_ok[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(xa[:, None] * b, axis=0)
    y = tl.load(y_ptr + t * stride_y + ns, mask=n_ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + t * stride_y + ns, (y + acc).to(y_ptr.dtype.element_ty), mask=n_ok)


def lora_add_triton(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                    slots: torch.Tensor, xa: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as `lora_add_ref` (y in place). `xa`: an fp32 [>= T, C] scratch buffer
    (allocated when None)."""
    check_lora_shapes(y, x, a, b)
    check_device(y, x, a, b, slots)
    T, K = x.shape
    S, C, N = b.shape
    for name, t in (("y", y), ("x", x), ("a", a), ("b", b)):
        if t.stride(-1) != 1:
            raise ValueError(f"lora_add_triton: {name}'s last dimension must be contiguous")
    if slots.shape != (T,):
        raise ValueError(f"lora_add_triton: slots {tuple(slots.shape)} must be [T={T}]")
    if T == 0:
        return y
    if xa is None:
        xa = torch.empty((T, C), dtype=torch.float32, device=x.device)
    block_c = min(64, triton.next_power_of_2(C))
    _lora_shrink_kernel[(T, triton.cdiv(C, block_c))](
        xa, x, a, slots, K, C, x.stride(0), a.stride(0), a.stride(1), xa.stride(0),
        BLOCK_C=block_c, BLOCK_K=min(128, triton.next_power_of_2(K)))
    block_n = min(128, triton.next_power_of_2(N))
    _lora_expand_kernel[(T, triton.cdiv(N, block_n))](
        y, xa, b, slots, C, N, y.stride(0), xa.stride(0), b.stride(0), b.stride(1),
        BLOCK_C=min(32, triton.next_power_of_2(C)), BLOCK_N=block_n)
    return y
