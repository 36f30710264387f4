"""Triton RMSNorm with fused residual add: the kernel behind `rmsnorm.rms_norm_ref`.

One program per row (token). With a residual it writes both x + residual (the new residual
stream) and norm(x + residual), reading each input once. Rounding follows the reference:
the sum and the normalised value are rounded to x's dtype before the weight multiply.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from inflight.kernels.triton_util import check_device


@triton.jit
def _rms_norm_kernel(out_ptr, res_out_ptr, x_ptr, res_ptr, w_ptr, eps, N,
                     stride_out, stride_res_out, stride_x, stride_res,
                     HAS_RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    ok = cols < N
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0)
    if HAS_RESIDUAL:
        x = (x.to(tl.float32) + tl.load(res_ptr + row * stride_res + cols, mask=ok, other=0.0).to(tl.float32))
        x = x.to(x_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * stride_res_out + cols, x, mask=ok)
    xf = x.to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(xf * xf, axis=0) / N + eps)
    normed = (xf * rstd).to(x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (normed * w).to(out_ptr.dtype.element_ty), mask=ok)


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float,
                    residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as `rms_norm_ref`: (norm(x [+ residual]), x [+ residual])."""
    N = x.shape[-1]
    assert weight.shape == (N,) and weight.is_contiguous(), (x.shape, weight.shape)
    assert x.stride(-1) == 1, "last dim must be contiguous"
    if residual is not None:
        assert residual.shape == x.shape and residual.dtype == x.dtype, (residual.shape, x.shape)
        assert residual.stride(-1) == 1
        check_device(x, weight, residual)
    else:
        check_device(x, weight)
    x2 = x.reshape(-1, N)
    rows = x2.shape[0]
    out = torch.empty((rows, N), dtype=x.dtype, device=x.device)
    res_in = residual.reshape(-1, N) if residual is not None else x2
    res_out = torch.empty_like(out) if residual is not None else out
    if rows:
        block_n = triton.next_power_of_2(N)
        _rms_norm_kernel[(rows,)](out, res_out, x2, res_in, weight, eps, N,
                                  out.stride(0), res_out.stride(0), x2.stride(0), res_in.stride(0),
                                  HAS_RESIDUAL=residual is not None, BLOCK_N=block_n,
                                  num_warps=min(16, max(1, block_n // 256)))
    out = out.view(x.shape)
    return (out, res_out.view(x.shape)) if residual is not None else (out, x)
