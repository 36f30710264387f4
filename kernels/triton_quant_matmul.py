"""Triton W8A16 and W4A16 GEMMs: the kernels behind `quant.w8a16_matmul_ref` / `w4a16_matmul_ref`.

y [M, N] = x [M, K] @ W^T with W kept as integers (formats in kernels/quant.py). Each
program owns one BLOCK_M x BLOCK_N tile of y and walks K in BLOCK_K steps; the integer
weight tile is loaded as [BLOCK_K, BLOCK_N] and dequantized in registers, so the weights
cross memory at 1 byte (w8) or half a byte (w4) per value:

    w8: acc += x_tile @ q_tile            ; y = acc * scales[n]       (per-channel scale
                                                                        applied once at the end)
    w4: w_tile = (nibble - zero[n, g]) * scale[n, g]   -> x's dtype ; acc += x_tile @ w_tile
        NOTE: BLOCK_K divides group_size, so one K tile lies inside one group and needs one
        scale and one zero per column.

Split-K: with few rows (decode: M = 1..16) there are only N / BLOCK_N tiles, too few to fill
the GPU, so the wrapper may cut K into SPLIT_K ranges (grid axis 2). Each split writes an
fp32 partial [SPLIT_K, M, N] and one torch sum reduces them: deterministic, no atomics.

    grid = (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N), SPLIT_K)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from inflight.kernels.quant import num_groups
from inflight.kernels.triton_util import check_device, is_cuda, num_sms


@triton.jit
def _load_x(x_ptr, offs_m, offs_k, M, K, stride_xm):
    return tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
                   mask=(offs_m[:, None] < M) & (offs_k[None, :] < K), other=0.0)


@triton.jit
def _store_tile(out_ptr, bias_ptr, acc, offs_m, offs_n, M, N, stride_om, stride_os, split,
                HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr):
    ok = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
        tl.store(ptrs, acc.to(out_ptr.dtype.element_ty), mask=ok)
    else:  # fp32 partial of this split; the wrapper sums the splits and adds the bias
        ptrs = out_ptr + split * stride_os + offs_m[:, None] * stride_om + offs_n[None, :]
        tl.store(ptrs, acc, mask=ok)


@triton.jit
def _w8a16_kernel(out_ptr, x_ptr, q_ptr, s_ptr, bias_ptr, M, N, K, k_per_split,
                  stride_xm, stride_qn, stride_om, stride_os,
                  HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, DOT_PRECISION: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    split = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k_begin = split * k_per_split
    k_end = tl.minimum(k_begin + k_per_split, K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = _load_x(x_ptr, offs_m, offs_k, M, K, stride_xm)
        q = tl.load(q_ptr + offs_n[None, :] * stride_qn + offs_k[:, None],
                    mask=(offs_k[:, None] < K) & (offs_n[None, :] < N), other=0)
        acc += tl.dot(x, q.to(x.dtype), input_precision=DOT_PRECISION)
    scale = tl.load(s_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
    _store_tile(out_ptr, bias_ptr, acc * scale[None, :], offs_m, offs_n, M, N, stride_om,
                stride_os, split, HAS_BIAS, SPLIT_K)


@triton.jit
def _w4a16_kernel(out_ptr, x_ptr, q_ptr, s_ptr, z_ptr, bias_ptr, M, N, K, k_per_split,
                  stride_xm, stride_qn, stride_sn, stride_zn, stride_om, stride_os,
                  GROUP_SIZE: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                  DOT_PRECISION: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    split = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    k_begin = split * k_per_split
    k_end = tl.minimum(k_begin + k_per_split, K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = _load_x(x_ptr, offs_m, offs_k, M, K, stride_xm)
        # each byte holds k = 2j (low nibble) and 2j + 1 (high): both lanes load it
        packed = tl.load(q_ptr + offs_n[None, :] * stride_qn + offs_k[:, None] // 2,
                         mask=(offs_k[:, None] < K) & n_ok[None, :], other=0)
        nibble = (packed.to(tl.int32) >> ((offs_k[:, None] % 2) * 4)) & 0xF
        g = k0 // GROUP_SIZE
        scale = tl.load(s_ptr + offs_n * stride_sn + g, mask=n_ok, other=0.0).to(tl.float32)
        zero = tl.load(z_ptr + offs_n * stride_zn + g, mask=n_ok, other=0).to(tl.float32)
        w = (nibble.to(tl.float32) - zero[None, :]) * scale[None, :]
        acc += tl.dot(x, w.to(x.dtype), input_precision=DOT_PRECISION)
    _store_tile(out_ptr, bias_ptr, acc, offs_m, offs_n, M, N, stride_om, stride_os, split,
                HAS_BIAS, SPLIT_K)


def pick_tiles(m: int, n: int, k: int, block_k: int, cuda: bool,
               split_k: int | None = None) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, SPLIT_K, k_per_split) for one call. Split-K only when the output
    tiles would leave most SMs idle, and never below four K tiles per split."""
    block_m = 16 if m <= 16 else 32 if m <= 32 else 64
    block_n = 64
    k_tiles = triton.cdiv(k, block_k)
    if split_k is None:
        tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
        split_k = 1
        if cuda:
            while (split_k < 16 and tiles * split_k * 2 <= num_sms()
                   and k_tiles >= 4 * split_k * 2):
                split_k *= 2
    split_k = max(1, min(split_k, k_tiles))
    k_per_split = triton.cdiv(k_tiles, split_k) * block_k
    return block_m, block_n, split_k, k_per_split


def _launch_shape(x: torch.Tensor, n: int, bias: torch.Tensor | None):
    assert x.stride(-1) == 1, "x's last dim must be contiguous"
    x2 = x.reshape(-1, x.shape[-1])
    if bias is not None:
        assert bias.shape == (n,) and bias.is_contiguous(), (bias.shape, n)
    return x2, x2.shape[0], x2.shape[1]


def _finish(out: torch.Tensor, split_k: int, bias: torch.Tensor | None, x: torch.Tensor,
            n: int) -> torch.Tensor:
    if split_k > 1:
        out = out.sum(dim=0)
        if bias is not None:
            out += bias.float()
        out = out.to(x.dtype)
    return out.view(*x.shape[:-1], n)


def _alloc(m: int, n: int, split_k: int, x: torch.Tensor) -> torch.Tensor:
    if split_k > 1:
        return torch.empty((split_k, m, n), dtype=torch.float32, device=x.device)
    return torch.empty((m, n), dtype=x.dtype, device=x.device)


def _dot_precision(x: torch.Tensor) -> str | None:
    return "ieee" if x.dtype == torch.float32 else None


def w8a16_matmul_triton(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                        bias: torch.Tensor | None = None,
                        split_k: int | None = None) -> torch.Tensor:
    """Same contract as `w8a16_matmul_ref`; `split_k` forces the split (tests)."""
    n, k = qweight.shape
    assert qweight.dtype == torch.int8 and qweight.is_contiguous(), (qweight.dtype, qweight.stride())
    assert scales.shape == (n,) and scales.is_contiguous(), (scales.shape, n)
    assert x.shape[-1] == k, (x.shape, qweight.shape)
    x2, m, _ = _launch_shape(x, n, bias)
    check_device(*(t for t in (x2, qweight, scales, bias) if t is not None))
    block_k = 64
    block_m, block_n, split, k_per_split = pick_tiles(m, n, k, block_k, is_cuda(x), split_k)
    out = _alloc(m, n, split, x)
    if m:
        stride_os = out.stride(0) if split > 1 else 0
        stride_om = out.stride(-2)
        _w8a16_kernel[(triton.cdiv(m, block_m), triton.cdiv(n, block_n), split)](
            out, x2, qweight, scales, bias if bias is not None else scales, m, n, k, k_per_split,
            x2.stride(0), qweight.stride(0), stride_om, stride_os,
            HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
            SPLIT_K=split, DOT_PRECISION=_dot_precision(x))
    return _finish(out, split, bias, x, n)


def w4a16_matmul_triton(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                        zeros: torch.Tensor, group_size: int, bias: torch.Tensor | None = None,
                        split_k: int | None = None) -> torch.Tensor:
    """Same contract as `w4a16_matmul_ref`; group_size 32, 64 or 128 (any multiple of 32)."""
    n, half_k = qweight.shape
    k = 2 * half_k
    assert qweight.dtype == torch.uint8 and qweight.is_contiguous(), (qweight.dtype, qweight.stride())
    assert group_size % 32 == 0, f"group_size={group_size} must be a multiple of 32"
    assert scales.shape == zeros.shape == (n, num_groups(k, group_size)), (scales.shape, zeros.shape)
    assert scales.stride(-1) == 1 and zeros.stride(-1) == 1
    assert x.shape[-1] == k, (x.shape, qweight.shape)
    x2, m, _ = _launch_shape(x, n, bias)
    check_device(*(t for t in (x2, qweight, scales, zeros, bias) if t is not None))
    block_k = 64 if group_size % 64 == 0 else 32  # divides group_size (see NOTE above)
    block_m, block_n, split, k_per_split = pick_tiles(m, n, k, block_k, is_cuda(x), split_k)
    out = _alloc(m, n, split, x)
    if m:
        stride_os = out.stride(0) if split > 1 else 0
        _w4a16_kernel[(triton.cdiv(m, block_m), triton.cdiv(n, block_n), split)](
            out, x2, qweight, scales, zeros, bias if bias is not None else scales, m, n, k,
            k_per_split, x2.stride(0), qweight.stride(0), scales.stride(0), zeros.stride(0),
            out.stride(-2), stride_os,
            GROUP_SIZE=group_size, HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n,
            BLOCK_K=block_k, SPLIT_K=split, DOT_PRECISION=_dot_precision(x))
    return _finish(out, split, bias, x, n)
