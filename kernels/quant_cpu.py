"""CPU paths for the quantized GEMMs.

16-bit activations: torch's packed int8 / int4 matmuls,

    torch._weight_int8pack_mm(x, qweight int8 [N, K], scales [N])          x bf16 / fp16
    torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, group, sz)       W = (q - 8) * s + zf

which beat a 16-bit dense matmul only for a few rows and lose to dequantize-on-the-fly
(`quant.dequantize_*` + F.linear) beyond that; given fp32 activations they run scalar code,
slower than dequantizing at any size. The row limits INT8/INT4_PACKED_MAX_ROWS are the
crossovers that `benchmarks/quantization.py --crossover` finds (SmolLM2-135M's projection
shapes, one thread, dequantizing with `quant.dequantize_w4_grouped`; figures in
docs/benchmarks.md): packed up to the limit, dequantize + dense beyond. The int4 kernel
wants its own weight layout (made by `_convert_weight_to_int4pack_for_cpu`), K a multiple
of the group size and N a multiple of 16. A ragged last group (K = 576 in groups of 128) is
padded with zero columns; x is padded to match at call time.

fp32 activations: this project's kernels (kernels/csrc/cpu_quant_linear.cpp),

    W8PackedCPU.from_w8(qweight, scales).matmul(x, bias)
    W4PackedCPU.from_w4(qweight, scales, zeros, group).matmul(x, bias)

exact (what `w8a16_matmul_ref` / `w4a16_matmul_ref` compute for fp32 x, the sums
reassociated): the integer weights are widened to fp32 in registers, nothing dequantized is
written to memory, so a decode step reads 1 (w8) or ~0.6 (w4) bytes per weight instead of
fp32's 4. They beat the dense fp32 matmul up to W8/W4_KERNEL_MAX_ROWS rows (measured by
benchmarks/cpu_kernels.py: the int4 one spends more instructions per weight and turns
compute-bound sooner), dequantize + dense beyond. Their weights are repacked once at load (`interleave`).
The C++ is built on first use, once per machine (kernels/cpu_native.py); where it cannot
be, the layers dequantize on the fly (same results, slower).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from inflight.kernels.cpu_native import native
from inflight.kernels.quant import unpack_int4

INT8_PACKED_MAX_ROWS = 32
INT4_PACKED_MAX_ROWS = 64
PACKED_DTYPES = (torch.bfloat16, torch.float16)
W8_KERNEL_MAX_ROWS = 64
W4_KERNEL_MAX_ROWS = 16


def aligned(t: torch.Tensor) -> torch.Tensor:
    """`t`, copied when its data is not 64-byte aligned.

    NOTE: torch's int8 kernel crashes (SIGSEGV) on misaligned weights, and tensors read
    from a safetensors file sit wherever the file's header puts them."""
    return t if t.data_ptr() % 64 == 0 else t.clone()


def w8a16_matmul_cpu(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
    """`w8a16_matmul_ref` through torch's int8 kernel; `scales` already in x's dtype and
    `qweight` 64-byte aligned (`aligned`)."""
    x2 = x.reshape(-1, x.shape[-1])
    y = torch._weight_int8pack_mm(x2.contiguous(), qweight, scales)
    if bias is not None:
        y = y + bias
    return y.view(*x.shape[:-1], qweight.shape[0])


@dataclass(frozen=True)
class Int4PackedCPU:
    """A w4 weight in torch's CPU int4 layout."""

    packed: torch.Tensor             # _convert_weight_to_int4pack_for_cpu output
    scales_and_zeros: torch.Tensor   # [G, N, 2] in the activations' dtype
    group_size: int
    k: int                           # real K; the packed weight may hold more (padding)

    @classmethod
    def supports(cls, n: int, group_size: int) -> bool:
        return n % 16 == 0 and group_size in (32, 64, 128, 256)

    @classmethod
    def from_w4(cls, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                group_size: int, dtype: torch.dtype) -> "Int4PackedCPU":
        """From the w4 format of kernels/quant.py: (q - z) * s == (q - 8) * s + (8 - z) * s."""
        q = unpack_int4(qweight)
        n, k = q.shape
        groups = scales.shape[-1]
        pad = groups * group_size - k
        q = F.pad(q.to(torch.int32), (0, pad), value=8)   # padded columns: (8 - 8) * s + 0
        s = scales.float()
        zf = (8.0 - zeros.float()) * s
        sz = torch.stack([s.t(), zf.t()], dim=-1).to(dtype).contiguous()
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.contiguous(), 1)
        return cls(packed, sz, group_size, k)

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        kp = self.scales_and_zeros.shape[0] * self.group_size
        if kp != self.k:
            x2 = F.pad(x2, (0, kp - self.k))
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2.contiguous(), self.packed, self.group_size,
                                                      self.scales_and_zeros)
        if bias is not None:
            y = y + bias
        return y.view(*x.shape[:-1], y.shape[-1])


NB = 4  # weight rows interleaved per tile (kernels/csrc/cpu_quant_linear.cpp)


def fits(n: int, k: int, group_size: int | None = None) -> bool:
    """Shapes the kernels take: N a multiple of 4, K of 32 (and the w4 group size too)."""
    return n % NB == 0 and k % 32 == 0 and (group_size is None or group_size % 32 == 0)


def interleave(q: torch.Tensor, run: int) -> torch.Tensor:
    """[N, B] bytes -> the kernels' layout: for each NB rows, their runs of `run` bytes
    interleaved (run r of row 0, of row 1, ... of row NB - 1, then run r + 1), so a tile
    reads its weights as one sequential stream, a cache line per step."""
    n, b = q.shape
    return q.view(n // NB, NB, b // run, run).transpose(1, 2).contiguous().view(n, b)


def split_int4(qweight: torch.Tensor) -> torch.Tensor:
    """Stored int4 [N, K/2] (even k low nibble) -> per 32 values, byte i = q[32c + i] |
    q[32c + 16 + i] << 4 (one 16-byte load widens into two vectors of 16 consecutive k)."""
    q = unpack_int4(qweight)
    n, k = q.shape
    runs = q.view(n, k // 32, 2, 16)
    return (runs[:, :, 0] | (runs[:, :, 1] << 4)).reshape(n, k // 2).contiguous()


@dataclass(frozen=True)
class W8PackedCPU:
    """A w8 weight in the kernels' layout, fp32 scales."""

    q: torch.Tensor         # [N, K] int8, interleaved
    scales: torch.Tensor    # [N] fp32

    @classmethod
    def from_w8(cls, qweight: torch.Tensor, scales: torch.Tensor) -> "W8PackedCPU":
        return cls(interleave(qweight, 16), scales.float().contiguous())

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        return native().w8_linear(x2, self.q, self.scales, bias).view(*x.shape[:-1], self.q.shape[0])


@dataclass(frozen=True)
class W4PackedCPU:
    """A w4 weight in the kernels' layout; the stored fp16 scales and uint8 zeros as they are
    (the kernel subtracts the zero in integers and scales each group's sum)."""

    q4: torch.Tensor        # [N, K/2] uint8: split, then interleaved
    scales: torch.Tensor    # [N, G] fp16
    zeros: torch.Tensor     # [N, G] uint8
    group_size: int

    @classmethod
    def from_w4(cls, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                group_size: int) -> "W4PackedCPU":
        return cls(interleave(split_int4(qweight), 16), scales.half().contiguous(), zeros.contiguous(),
                   group_size)

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        y = native().w4_linear(x2, self.q4, self.scales, self.zeros, self.group_size, bias)
        return y.view(*x.shape[:-1], y.shape[-1])
