"""Weight-only quantized formats and their plain-torch references (W8A16, W4A16).

A quantized linear layer y = x @ W^T (+ bias), W [N, K], keeps integers plus scales:

    w8  per-output-channel symmetric int8:
        qweight [N, K] int8,            scales [N]                 W[n, k] = q[n, k] * s[n]
    w4  group-wise asymmetric int4 (G = ceil(K / group_size) groups along K; the last may
        be shorter, e.g. K = 576 with groups of 128):
        qweight [N, K // 2] uint8,      scales [N, G], zeros [N, G] uint8 in [0, 15]
        W[n, k] = (q[n, k] - zeros[n, k // g]) * scales[n, k // g]

int4 nibble packing along K, two values per byte, even k in the low nibble:

    byte [n, j] = q[n, 2j] | q[n, 2j + 1] << 4

Dequantization (these references, and every kernel) computes in fp32 and rounds W once
to the activations' dtype: the Triton kernels and the CPU paths are tested against it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """[..., K] integers in [0, 15] -> [..., K // 2] uint8 (K even)."""
    if q.shape[-1] % 2:
        raise ValueError(f"int4 packing needs an even last dimension, got {tuple(q.shape)}")
    if q.numel() and (int(q.min()) < 0 or int(q.max()) > 15):
        raise ValueError(f"int4 values must lie in [0, 15], got [{int(q.min())}, {int(q.max())}]")
    q = q.to(torch.uint8)
    return (q[..., 0::2] | (q[..., 1::2] << 4)).contiguous()


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """[..., K // 2] uint8 -> [..., K] uint8 in [0, 15] (inverse of pack_int4)."""
    if packed.dtype != torch.uint8:
        raise ValueError(f"packed int4 weights are uint8, got {packed.dtype}")
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2)


def num_groups(k: int, group_size: int) -> int:
    return -(-k // group_size)


def dequantize_w8(qweight: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """int8 [N, K] and scales [N] -> W [N, K] in `dtype`."""
    return (qweight.float() * scales.float()[:, None]).to(dtype)


def dequantize_w4(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                  group_size: int, dtype: torch.dtype) -> torch.Tensor:
    """packed uint8 [N, K // 2], scales/zeros [N, G] -> W [N, K] in `dtype`."""
    q = unpack_int4(qweight)
    k = q.shape[-1]
    if scales.shape != zeros.shape or scales.shape[-1] != num_groups(k, group_size):
        raise ValueError(f"scales {tuple(scales.shape)} / zeros {tuple(zeros.shape)} do not "
                         f"fit K={k} in groups of {group_size}")
    s = scales.float().repeat_interleave(group_size, dim=-1)[..., :k]
    z = zeros.float().repeat_interleave(group_size, dim=-1)[..., :k]
    return ((q.float() - z) * s).to(dtype)


def dequantize_w4_grouped(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                          group_size: int, dtype: torch.dtype) -> torch.Tensor:
    """`dequantize_w4`, bit for bit, in fewer and cheaper passes (what the engine's layers
    call: on CPU the repeated scale/zero tensors of the plain version were the cost of
    dequantizing; docs/benchmarks.md): nibbles are unpacked into one int8
    buffer padded to whole groups, zeros subtracted in int8 through a [N, G, g] view (no
    repeated scale/zero tensors), then one fp32 multiply. qweight [N, K // 2] only."""
    n, half = qweight.shape
    k = 2 * half
    groups = scales.shape[-1]
    if scales.shape != zeros.shape or scales.shape != (n, num_groups(k, group_size)):
        raise ValueError(f"scales {tuple(scales.shape)} / zeros {tuple(zeros.shape)} do not "
                         f"fit K={k} in groups of {group_size}")
    q = torch.empty(n, groups * group_size, dtype=torch.int8, device=qweight.device)
    pairs = q[:, :k].unflatten(1, (half, 2))
    pairs[..., 0] = qweight & 0xF
    pairs[..., 1] = qweight >> 4
    q[:, k:] = 0  # a ragged last group's padding, sliced off below
    q3 = q.view(n, groups, group_size)
    q3 -= zeros.to(torch.int8)[..., None]             # (q - z) in [-15, 15]: exact
    w = q3.float()
    w *= scales.float()[..., None]                    # the reference's fp32 product
    return w.view(n, -1)[:, :k].to(dtype).contiguous()


def w8a16_matmul_ref(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ dequantize_w8(...)^T (+ bias) -> [M, N] in x's dtype."""
    return F.linear(x, dequantize_w8(qweight, scales, x.dtype), bias)


def w4a16_matmul_ref(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                     zeros: torch.Tensor, group_size: int,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ dequantize_w4(...)^T (+ bias) -> [M, N] in x's dtype."""
    return F.linear(x, dequantize_w4(qweight, scales, zeros, group_size, x.dtype), bias)
