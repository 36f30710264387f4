"""The linear layers the model builds from its checkpoint: dense, w8 or w4.

A layer is a callable `x [T, K] -> [T, N]` in x's dtype. `load_linear` reads one or more
projections that share an input (q|k|v, gate|up) and fuses them along N: per-channel
scales and K-groups do not cross output rows, so quantized parts concatenate like dense
ones.

How a quantized layer computes depends on the kernel backend:
- triton: the W8A16 / W4A16 kernels (kernels/triton_quant_matmul.py) on the stored layout;
- torch on CPU with 16-bit activations: torch's packed int matmuls for few rows (decode),
  dequantize-on-the-fly + dense matmul above the measured crossover (kernels/quant_cpu.py);
- torch otherwise (fp32 activations, CUDA with INFLIGHT_KERNELS=torch): dequantize-on-the-fly.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

import torch
import torch.nn.functional as F

from inflight.engine.quant.config import QuantConfig
from inflight.kernels.quant import dequantize_w4_grouped, dequantize_w8, num_groups
from inflight.kernels.quant_cpu import (INT4_PACKED_MAX_ROWS, INT8_PACKED_MAX_ROWS, PACKED_DTYPES,
                               Int4PackedCPU, aligned, w8a16_matmul_cpu)
from inflight.engine.errors import ModelError

Take = Callable[[str, bool], "torch.Tensor | None"]  # (name, required) -> stored tensor


class Linear(Protocol):
    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


# NOTE: on CPU (fp32, MKL, one thread; docs/benchmarks.md, speculative decoding) a matmul of
# a few rows (a speculative verification: 2-32 tokens) runs markedly faster against a
# weight stored transposed, [K, N] contiguous (x @ W_t), than through F.linear's [N, K]
# layout, and never slower for one row or many: dense layers keep their weight that way
# there. The LM head is the embedding too (its rows are looked up), so it keeps [N, K] and
# a few rows go through it in slices of its output columns (`dense_linear`), each slice
# read once, while in cache, for all rows.
FEW_ROWS = (2, 32)
COLUMN_SLICE = 512


def dense_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear of an [N, K] weight, in column slices for a few rows on CPU (NOTE above)."""
    N = weight.shape[0]
    if x.device.type != "cpu" or not FEW_ROWS[0] <= x.shape[0] <= FEW_ROWS[1] or N <= COLUMN_SLICE:
        return F.linear(x, weight, bias)
    return torch.cat([F.linear(x, weight[i:i + COLUMN_SLICE],
                               None if bias is None else bias[i:i + COLUMN_SLICE])
                      for i in range(0, N, COLUMN_SLICE)], dim=1)


class DenseLinear:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        self.bias = bias
        # transposed on CPU in fp32 (the NOTE above); `weight` is [N, K] either way
        self.transposed = weight.device.type == "cpu" and weight.dtype == torch.float32
        self._w = weight.t().contiguous() if self.transposed else weight

    @property
    def weight(self) -> torch.Tensor:
        return self._w.t() if self.transposed else self._w

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self.transposed:
            return F.linear(x, self._w, self.bias)
        return x @ self._w if self.bias is None else torch.addmm(self.bias, x, self._w)


class W8Linear:
    """Per-output-channel symmetric int8 weights, 16/32-bit activations."""

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None,
                 dtype: torch.dtype, backend: str):
        self.qweight, self.scales, self.bias, self.dtype = qweight, scales, bias, dtype
        self.triton = backend == "triton"
        # torch's int8 kernel wants the scales in the activations' dtype
        self.cpu_scales = (scales.to(dtype) if not self.triton and qweight.device.type == "cpu"
                           and dtype in PACKED_DTYPES else None)
        if self.cpu_scales is not None:
            self.qweight = aligned(qweight)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.triton:
            from inflight.kernels.triton_quant_matmul import w8a16_matmul_triton

            return w8a16_matmul_triton(x, self.qweight, self.scales, self.bias)
        if self.cpu_scales is not None and x.shape[0] <= INT8_PACKED_MAX_ROWS:
            return w8a16_matmul_cpu(x, self.qweight, self.cpu_scales, self.bias)
        return F.linear(x, dequantize_w8(self.qweight, self.scales, x.dtype), self.bias)

    def dequantized(self) -> torch.Tensor:
        return dequantize_w8(self.qweight, self.scales, self.dtype)


class W4Linear:
    """Group-wise asymmetric int4 weights, 16/32-bit activations."""

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                 group_size: int, bias: torch.Tensor | None, dtype: torch.dtype, backend: str):
        self.qweight, self.scales, self.zeros = qweight, scales, zeros
        self.group_size, self.bias, self.dtype = group_size, bias, dtype
        self.triton = backend == "triton"
        n = qweight.shape[0]
        # NOTE: on CPU this keeps a second copy in torch's int4 layout (half a byte per
        # weight) beside the stored one, which the dequantizing path for many rows reads.
        self.cpu_packed = (Int4PackedCPU.from_w4(qweight, scales, zeros, group_size, dtype)
                           if not self.triton and qweight.device.type == "cpu"
                           and dtype in PACKED_DTYPES and Int4PackedCPU.supports(n, group_size)
                           else None)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.triton:
            from inflight.kernels.triton_quant_matmul import w4a16_matmul_triton

            return w4a16_matmul_triton(x, self.qweight, self.scales, self.zeros, self.group_size,
                                       self.bias)
        if self.cpu_packed is not None and x.shape[0] <= INT4_PACKED_MAX_ROWS:
            return self.cpu_packed.matmul(x, self.bias)
        return F.linear(x, self.dequantized(x.dtype), self.bias)

    def dequantized(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        return dequantize_w4_grouped(self.qweight, self.scales, self.zeros, self.group_size,
                                     dtype or self.dtype)


def _cat(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    return parts[0].contiguous() if len(parts) == 1 else torch.cat(list(parts)).contiguous()


def load_linear(take: Take, names: Sequence[str], quant: QuantConfig | None, dtype: torch.dtype,
                device: torch.device, backend: str, where: object = "") -> Linear:
    """Build one (fused) linear layer from the projections `names` (e.g. "layers.0.mlp.up_proj").
    `take(name, required)` returns a stored tensor as is (any dtype, on CPU) or None."""
    biases = [take(n + ".bias", False) for n in names]
    bias = (_cat([b.to(device=device, dtype=dtype) for b in biases])
            if all(b is not None for b in biases) else None)
    if quant is None:
        return DenseLinear(_cat([take(n + ".weight", True).to(device=device, dtype=dtype)
                                 for n in names]), bias)

    def parts(suffix: str, want: torch.dtype) -> torch.Tensor:
        ts = [take(n + suffix, True) for n in names]
        for n, t in zip(names, ts):
            if t.dtype != want:
                raise ModelError(f"{where}: {n + suffix} is {t.dtype}, expected {want} for "
                                 f"scheme {quant.scheme}; re-create the folder with `inflight quantize`")
        return _cat([t.to(device) for t in ts])

    if quant.scheme == "w8":
        q, s = parts(".qweight", torch.int8), parts(".scales", torch.float16)
        if s.shape != (q.shape[0],):
            raise ModelError(f"{where}: {names[0]}.scales has shape {tuple(s.shape)}, expected ({q.shape[0]},)")
        return W8Linear(q, s, bias, dtype, backend)
    q, s, z = parts(".qweight", torch.uint8), parts(".scales", torch.float16), parts(".qzeros", torch.uint8)
    groups = num_groups(2 * q.shape[1], quant.group_size)
    if s.shape != (q.shape[0], groups) or z.shape != s.shape:
        raise ModelError(f"{where}: {names[0]} scales {tuple(s.shape)} / zeros {tuple(z.shape)} do "
                         f"not fit K={2 * q.shape[1]} in groups of {quant.group_size}")
    return W4Linear(q, s, z, quant.group_size, bias, dtype, backend)
