"""CPU paths for the quantized GEMMs: torch's packed int8 / int4 matmuls.

    torch._weight_int8pack_mm(x, qweight int8 [N, K], scales [N])          x bf16 / fp16
    torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, group, sz)       W = (q - 8) * s + zf

They beat a 16-bit dense matmul only for a few rows and lose to dequantize-on-the-fly
(`quant.dequantize_*` + F.linear) beyond that; in fp32 they are slower than dequantizing
at any size. The row limits below are the crossovers that `benchmarks/quantization.py
--crossover` finds (SmolLM2-135M's projection shapes, one thread, dequantizing with
`quant.dequantize_w4_grouped`; figures in docs/benchmarks.md): packed up to the limit,
dequantize + dense beyond.

The int4 kernel wants its own weight layout (made by `_convert_weight_to_int4pack_for_cpu`),
K a multiple of the group size and N a multiple of 16. A ragged last group (K = 576 in
groups of 128) is padded with zero columns; x is padded to match at call time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from inflight.kernels.quant import unpack_int4

INT8_PACKED_MAX_ROWS = 32
INT4_PACKED_MAX_ROWS = 64
PACKED_DTYPES = (torch.bfloat16, torch.float16)


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
