"""The linear layers the model builds from its checkpoint: dense, w8 or w4.

A layer is a callable `x [T, K] -> [T, N]` in x's dtype. `load_linear` reads one or more
projections that share an input (q|k|v, gate|up) and fuses them along N: per-channel
scales and K-groups do not cross output rows, so quantized parts concatenate like dense
ones.

How a quantized layer computes depends on the kernel backend:
- triton: the W8A16 / W4A16 kernels (kernels/triton_quant_matmul.py) on the stored layout;
- torch on CPU with 16-bit activations: torch's packed int matmuls for few rows (decode),
  dequantize-on-the-fly + dense matmul above the measured crossover (kernels/quant_cpu.py);
- torch on CPU with fp32 activations: the project's exact int8 / int4 kernels (repacked
  copy, kernels/quant_cpu.py) up to their measured crossover, dequantize-on-the-fly beyond
  (and everywhere when they cannot be built here);
- torch otherwise (CUDA with INFLIGHT_KERNELS=torch): dequantize-on-the-fly.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

import torch
import torch.nn.functional as F

from inflight.engine.quant.config import QuantConfig
from inflight.kernels.cpu_native import native
from inflight.kernels.quant import dequantize_w4_grouped, dequantize_w8, num_groups
from inflight.kernels.quant_cpu import (INT4_PACKED_MAX_ROWS, INT8_PACKED_MAX_ROWS, PACKED_DTYPES,
                                       W4_KERNEL_MAX_ROWS, W8_KERNEL_MAX_ROWS, Int4PackedCPU,
                                       W4PackedCPU, W8PackedCPU, aligned, fits, w8a16_matmul_cpu)
from inflight.engine.errors import ModelError

Take = Callable[[str, bool], "torch.Tensor | None"]  # (name, required) -> stored tensor


class Linear(Protocol):
    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


# NOTE: on CPU in fp32 (one thread; measured on SmolLM2-135M's shapes, docs/benchmarks.md,
# speculative decoding) MKL's F.linear costs about the same for 1 to 3 rows (a decode, a
# verification of 1-2 drafts), then jumps: 4-32 rows (longer verifications, a batch of
# decodes) cost up to 2.5x one row against a weight much larger than the L2 cache. oneDNN's
# inner product on the same [N, K] weight (no copy, no reorder) reads it far better there
# (9 rows: 1.7x one row instead of 2.5x): dense layers and the LM head of at least
# ONEDNN_MIN_BYTES take it for ONEDNN_ROWS rows. Small weights stay in cache either way
# and keep F.linear; so do one row and many (a prefill chunk), where MKL is at its best.
ONEDNN_ROWS = (4, 32)
ONEDNN_MIN_BYTES = 3 << 20
_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


# NOTE: for 1 to F32_KERNEL_MAX_ROWS rows on CPU in fp32 (decode steps, verifications) the
# project's kernel (kernels/csrc/cpu_dense_linear.cpp) beats both: as fast as MKL for one
# row on one thread, faster from 2 rows on (each tile of 4 weight rows is read once and kept
# in L1 for every 4 rows of activations), and with two threads far faster than MKL's
# threaded GEMV, whose threads wait on each other through every small product
# (benchmarks/cpu_kernels.py; docs/benchmarks.md). Prefill chunks (more rows) keep
# oneDNN / MKL, whose GEMMs are the faster ones there.
F32_KERNEL_MAX_ROWS = 64


def takes_f32_kernel(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (x.device.type == "cpu" and x.dim() == 2 and x.shape[0] <= F32_KERNEL_MAX_ROWS
            and x.dtype == torch.float32 and weight.dtype == torch.float32 and x.shape[1] % 16 == 0
            and weight.is_contiguous() and native() is not None and native().f32_linear_supported())


def takes_onednn(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Does x @ weight.T go through oneDNN (the NOTE above)?"""
    return (_ONEDNN and x.dim() == 2 and ONEDNN_ROWS[0] <= x.shape[0] <= ONEDNN_ROWS[1]
            and x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32
            and weight.numel() * 4 >= ONEDNN_MIN_BYTES)


def dense_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear of an [N, K] weight; a few rows on CPU in fp32 through the project's kernel
    or oneDNN (NOTEs above)."""
    if takes_f32_kernel(x, weight):
        return native().f32_linear(x.contiguous(), weight, bias)
    if takes_onednn(x, weight):
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


class DenseLinear:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        self.weight, self.bias = weight, bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return dense_linear(x, self.weight, self.bias)


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
        # NOTE: a second copy (the kernels' layout) beside the stored one, which the
        # dequantizing path for many rows reads
        self.cpu_fp32 = (W8PackedCPU.from_w8(qweight, scales) if _fp32_kernels(self, qweight.shape)
                         else None)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.triton:
            from inflight.kernels.triton_quant_matmul import w8a16_matmul_triton

            return w8a16_matmul_triton(x, self.qweight, self.scales, self.bias)
        if self.cpu_fp32 is not None and x.shape[0] <= W8_KERNEL_MAX_ROWS:
            return self.cpu_fp32.matmul(x, self.bias)
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
        self.cpu_fp32 = (W4PackedCPU.from_w4(qweight, scales, zeros, group_size)
                         if _fp32_kernels(self, (n, 2 * qweight.shape[1]), group_size) else None)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.triton:
            from inflight.kernels.triton_quant_matmul import w4a16_matmul_triton

            return w4a16_matmul_triton(x, self.qweight, self.scales, self.zeros, self.group_size,
                                       self.bias)
        if self.cpu_fp32 is not None and x.shape[0] <= W4_KERNEL_MAX_ROWS:
            return self.cpu_fp32.matmul(x, self.bias)
        if self.cpu_packed is not None and x.shape[0] <= INT4_PACKED_MAX_ROWS:
            return self.cpu_packed.matmul(x, self.bias)
        return F.linear(x, self.dequantized(x.dtype), self.bias)

    def dequantized(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        return dequantize_w4_grouped(self.qweight, self.scales, self.zeros, self.group_size,
                                     dtype or self.dtype)


def _fp32_kernels(layer, shape: tuple[int, int], group_size: int | None = None) -> bool:
    """Does this layer take the exact fp32 int8/int4 kernels (torch backend, CPU, fp32
    activations, a shape they take, and they build here)?"""
    return (not layer.triton and layer.qweight.device.type == "cpu" and layer.dtype == torch.float32
            and fits(*shape, group_size) and native() is not None)


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
