"""Triton SwiGLU: the kernel behind `activation.silu_and_mul_ref`.

x [..., 2 * I] (gate | up) -> silu(gate) * up [..., I], fp32 math. grid = (rows, I / BLOCK).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from inflight.kernels.triton_util import check_device


@triton.jit
def _silu_and_mul_kernel(out_ptr, x_ptr, inter, stride_out, stride_x, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < inter
    gate = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + inter + cols, mask=ok, other=0.0).to(tl.float32)
    out = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + row * stride_out + cols, out.to(out_ptr.dtype.element_ty), mask=ok)


def silu_and_mul_triton(x: torch.Tensor) -> torch.Tensor:
    """Same contract as `silu_and_mul_ref`."""
    assert x.shape[-1] % 2 == 0 and x.stride(-1) == 1, (x.shape, x.stride())
    check_device(x)
    inter = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * inter)
    out = torch.empty((x2.shape[0], inter), dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        block = min(1024, triton.next_power_of_2(inter))
        _silu_and_mul_kernel[(x2.shape[0], triton.cdiv(inter, block))](
            out, x2, inter, out.stride(0), x2.stride(0), BLOCK=block, num_warps=4)
    return out.view(*x.shape[:-1], inter)
