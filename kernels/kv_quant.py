"""8-bit KV cache: how keys and values are stored when `kv_cache_dtype` is int8 or fp8.

Scheme (the same in the torch reference and the Triton kernels): one scale per token per
KV head, computed when the token is written (dynamic; nothing to calibrate, no clipping):

    scale      = fp16(max(absmax(x[t, h, :]) / QMAX, 2^-24))      QMAX: int8 127, fp8 e4m3 448
    stored     = int8:  clamp(round(x / scale), -127, 127)
                 fp8:   e4m3(clamp(x / scale, -448, 448))
    read back  = stored * scale                                   (fp32 math)

    k_cache/v_cache  [num_blocks, block_size, Hkv, D]  int8 or float8_e4m3fn
    k_scale/v_scale  [num_blocks, block_size, Hkv]     float16

A layer's cache is then the 4-tuple (k_cache, v_cache, k_scale, v_scale); in the model
dtype ("auto") it stays the pair (k_cache, v_cache). A token's scales live in the same
block as its values, so whatever moves or shares blocks (prefix caching, preemption,
speculative roll-back) moves the scales with them. Cost: 2 bytes of scale per D bytes of
values (head dim 64: 66 bytes per token-head against 128 in fp16/bf16, 256 in fp32).
"""

from __future__ import annotations

import torch

KV_CACHE_DTYPES = {"auto": None, "int8": torch.int8, "fp8": torch.float8_e4m3fn,
                   "fp8_e4m3": torch.float8_e4m3fn}
SCALE_DTYPE = torch.float16
QMAX = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0}
# fp16's smallest subnormal: a zero row still gets a scale (no 0/0); rows down to an absmax
# of ~1e-3 keep int8's half-step error (a subnormal scale rounds coarser below that)
MIN_SCALE = 2.0 ** -24


def is_quantized(dtype: torch.dtype) -> bool:
    return dtype in QMAX


def cache_bytes_per_token_head(dtype: torch.dtype, head_dim: int) -> int:
    """Bytes one token's key (or value) of one KV head takes in a cache of `dtype`."""
    return head_dim * dtype.itemsize + (SCALE_DTYPE.itemsize if is_quantized(dtype) else 0)


def quantize_kv(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] -> (values [..., D] of `dtype`, scales [...] fp16), one scale per row."""
    qmax = QMAX[dtype]
    xf = x.float()
    scale = (xf.abs().amax(dim=-1) / qmax).clamp(min=MIN_SCALE).to(SCALE_DTYPE)
    y = xf / scale.float()[..., None]
    if dtype == torch.int8:
        return y.round().clamp(-qmax, qmax).to(torch.int8), scale
    return y.clamp(-qmax, qmax).to(dtype), scale


def dequantize_kv(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """values [..., D] int8/fp8, scales [...] -> fp32 [..., D]."""
    return values.float() * scales.float()[..., None]
