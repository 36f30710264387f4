"""Round-to-nearest quantizers: scales/zeros from a weight's range, then q = round(w / s).

Both work on an fp32 copy; scales are rounded to fp16 (their stored dtype) *before* q is
computed, so the stored integers are the nearest ones for the scale the kernels will read.
The same per-group parameter functions serve GPTQ (engine/quant/gptq.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inflight.kernels.quant import num_groups, pack_int4

INT8_MAX = 127
INT4_MAX = 15
MIN_SCALE = 1e-8  # an all-zero row or group still gets a finite, positive scale
# w4_params_search: shrink the range in steps of 1/40 down to 60%, error measured as
# sum |err|^2.4 (the GPTQ authors' norm: between squared and worst-case error)
SEARCH_GRID, SEARCH_MAX_SHRINK, SEARCH_NORM = 40, 0.4, 2.4


@dataclass
class QuantizedWeight:
    """One projection in a stored scheme: w8 (zeros None, scales [N]) or w4 (packed)."""

    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None = None

    def tensors(self, name: str) -> dict[str, torch.Tensor]:
        out = {f"{name}.qweight": self.qweight, f"{name}.scales": self.scales}
        if self.zeros is not None:
            out[f"{name}.qzeros"] = self.zeros
        return out


def w8_scales(w: torch.Tensor) -> torch.Tensor:
    """Per-row symmetric scale [N] (fp16 values, fp32 tensor) for w [N, K]."""
    amax = w.abs().amax(dim=-1).float()
    return (amax / INT8_MAX).clamp(min=MIN_SCALE).half().float()


def w8_round(w: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """w [N, K] or [N] column(s) -> int8-valued fp32 (q)."""
    s = scales if w.dim() == 1 else scales[:, None]
    return torch.clamp(torch.round(w / s), -INT8_MAX, INT8_MAX)


def w4_params(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Asymmetric (scale, zero) per row of one group w [N, g]: the range always holds 0
    (GPTQ's convention), so a zero weight is exact."""
    return _w4_scale_zero(*_w4_range(w))


def _w4_range(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of w [N, g]: (lo, hi), the range that holds every weight and 0."""
    return w.min(dim=-1).values.clamp(max=0).float(), w.max(dim=-1).values.clamp(min=0).float()


def _w4_scale_zero(lo: torch.Tensor, hi: torch.Tensor, p: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, zero) of the range p * [lo, hi]; the scale as fp16 stores it."""
    scale = ((hi - lo) * p / INT4_MAX).clamp(min=MIN_SCALE).half().float()
    zero = torch.clamp(torch.round(-lo * p / scale), 0, INT4_MAX)
    return scale, zero


def w4_params_search(w: torch.Tensor, grid: int = SEARCH_GRID, max_shrink: float = SEARCH_MAX_SHRINK,
                     norm: float = SEARCH_NORM, importance: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Like `w4_params`, with the range shrunk per row to what rounds best: the (scale, zero)
    of p * [lo, hi] for p = 1, 1 - 1/grid, ... 1 - max_shrink that minimises
    sum |w - dequant(w)|^norm (the `mse` search of the GPTQ authors' quantizer). A group's
    extreme weights get clipped when that brings the rest closer to the grid; GPTQ's
    error feedback then spreads what clipping costs. `importance` [g] weighs each column's
    error (GPTQ passes the Hessian's diagonal: the inputs' mean energy)."""
    lo0, hi0 = _w4_range(w)
    wf = w.float()
    best = torch.full_like(lo0, float("inf"))
    scale_best, zero_best = torch.zeros_like(lo0), torch.zeros_like(lo0)
    for i in range(round(max_shrink * grid) + 1):
        scale, zero = _w4_scale_zero(lo0, hi0, 1.0 - i / grid)
        deq = (w4_round(wf, scale, zero) - zero[:, None]) * scale[:, None]
        err = (deq - wf).abs().pow(norm)
        err = (err if importance is None else err * importance).sum(dim=-1)
        better = err < best
        best = torch.where(better, err, best)
        scale_best = torch.where(better, scale, scale_best)
        zero_best = torch.where(better, zero, zero_best)
    return scale_best, zero_best


def w4_round(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """w [N, g] or [N] with per-row scale/zero -> int4-valued fp32 (q in [0, 15])."""
    if w.dim() == 2:
        scale, zero = scale[:, None], zero[:, None]
    return torch.clamp(torch.round(w / scale) + zero, 0, INT4_MAX)


def quantize_w8(w: torch.Tensor) -> QuantizedWeight:
    w = w.float()
    s = w8_scales(w)
    return QuantizedWeight(w8_round(w, s).to(torch.int8), s.half())


def quantize_w4(w: torch.Tensor, group_size: int) -> QuantizedWeight:
    w = w.float()
    n, k = w.shape
    q = torch.empty(n, k, device=w.device)
    scales = torch.empty(n, num_groups(k, group_size), device=w.device)
    zeros = torch.empty_like(scales)
    for g, start in enumerate(range(0, k, group_size)):
        part = w[:, start:start + group_size]
        scales[:, g], zeros[:, g] = w4_params(part)
        q[:, start:start + group_size] = w4_round(part, scales[:, g], zeros[:, g])
    return pack_w4(q, scales, zeros)


def pack_w4(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> QuantizedWeight:
    return QuantizedWeight(pack_int4(q.to(torch.uint8)), scales.half(), zeros.to(torch.uint8))
