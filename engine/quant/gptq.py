"""GPTQ (Frantar et al., 2022): quantize a weight column by column, spreading each
column's rounding error over the columns not yet quantized, weighted by the inverse
Hessian of the layer's inputs, so the layer's *outputs* on calibration data move least.

    H = 2/n * sum_x x x^T            [K, K], x the layer's inputs (calibration tokens)
    U = chol(H^-1)^T (upper)          after damping H += 1% * mean(diag H) * I
    for each column i:   q_i = quant(w_i);  e = (w_i - q_i) / U[i, i]
                         w_j -= e * U[i, j]   for every j > i

Columns go by decreasing H diagonal (act-order: the inputs with the most energy first),
in blocks of 128 with lazy updates of the columns after the block. w4 groups stay static:
each group's scale and zero come from the weights before any update, so the stored layout
(groups of consecutive K, what the kernels read) is unchanged by the visiting order.
`act_order=False` visits columns in order and takes a group's parameters at its first
column from the already-updated weights.
"""

from __future__ import annotations

import torch

from inflight.engine.quant.config import QuantConfig
from inflight.engine.quant.rtn import (QuantizedWeight, pack_w4, w4_params_search, w4_round, w8_round,
                              w8_scales)
from inflight.kernels.quant import num_groups

DAMP = 0.01
BLOCK = 128


class HessianAccumulator:
    """Running 2/n * X^T X over batches of a layer's input rows (each batch's product in
    fp32, the running sum in fp64)."""

    def __init__(self, k: int):
        self.h = torch.zeros(k, k, dtype=torch.float64)
        self.n = 0

    def add(self, x: torch.Tensor) -> None:
        x = x.reshape(-1, x.shape[-1]).float()
        self.h += (x.t() @ x).double()
        self.n += x.shape[0]

    def hessian(self) -> torch.Tensor:
        return (2.0 / max(self.n, 1)) * self.h


def _inverse_cholesky(h: torch.Tensor) -> torch.Tensor:
    """Upper Cholesky factor of the damped H^-1."""
    damp = DAMP * torch.mean(torch.diag(h))
    h = h + damp * torch.eye(h.shape[0], dtype=h.dtype)
    for _ in range(6):  # escalate the damping if rounding made H indefinite
        l, info = torch.linalg.cholesky_ex(h)
        if int(info) == 0:
            break
        h += damp * torch.eye(h.shape[0], dtype=h.dtype)
        damp *= 10
    hinv = torch.cholesky_inverse(l)
    return torch.linalg.cholesky(hinv, upper=True)


def gptq_quantize(w: torch.Tensor, h: torch.Tensor, quant: QuantConfig,
                  act_order: bool = True) -> tuple[QuantizedWeight, torch.Tensor]:
    """Quantize w [N, K] with the input Hessian h [K, K]. Returns the stored weight and its
    dequantized fp32 value (what the next layers' calibration inputs are computed with).

    `act_order`: visit columns by decreasing H diagonal (the inputs with the most energy
    first, while the most columns are left to absorb their error). Groups stay static (each
    group's scale and zero come from the weights before any update), so the stored layout
    is unchanged. Without it, columns go in order and a group's parameters are taken at its
    first column from the already-updated weights."""
    w = w.double().clone()
    h = h.double().clone()
    n, k = w.shape
    dead = torch.diag(h) == 0  # an input that is always 0: its weights cannot matter
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    g = quant.group_size or k
    if quant.scheme == "w8":
        scale8 = w8_scales(w).double()
    else:
        scales = torch.zeros(n, num_groups(k, g), dtype=torch.float64)
        zeros = torch.zeros_like(scales)
        energy = torch.diag(h).float()  # a w4 group's range search weighs each input's error by it
        if act_order:
            for gi, start in enumerate(range(0, k, g)):
                s_, z_ = w4_params_search(w[:, start:start + g],
                                          importance=energy[start:start + g])
                scales[:, gi], zeros[:, gi] = s_.double(), z_.double()
    perm = torch.argsort(torch.diag(h), descending=True) if act_order else torch.arange(k)
    w = w[:, perm]
    u = _inverse_cholesky(h[perm][:, perm])
    order = perm.tolist()
    q = torch.zeros(n, k, dtype=torch.float64)
    deq = torch.zeros_like(w)
    block = BLOCK if BLOCK % g == 0 or quant.scheme == "w8" else g
    for b0 in range(0, k, block):
        b1 = min(b0 + block, k)
        w1 = w[:, b0:b1].clone()
        err = torch.zeros_like(w1)
        u1 = u[b0:b1, b0:b1]
        for i in range(b1 - b0):
            col = order[b0 + i]  # the column's index in the stored layout
            if quant.scheme == "w8":
                qi = w8_round(w1[:, i], scale8)
                di = qi * scale8
            else:
                if not act_order and col % g == 0:  # a group's first column, updated weights
                    s_, z_ = w4_params_search(w1[:, i:i + g],
                                              importance=energy[col:col + g])
                    scales[:, col // g], zeros[:, col // g] = s_.double(), z_.double()
                s_, z_ = scales[:, col // g], zeros[:, col // g]
                qi = w4_round(w1[:, i], s_, z_)
                di = (qi - z_) * s_
            q[:, col], deq[:, col] = qi, di
            e = (w1[:, i] - di) / u1[i, i]
            w1[:, i:] -= e[:, None] * u1[i, i:][None, :]
            err[:, i] = e
        w[:, b1:] -= err @ u[b0:b1, b1:]
    if quant.scheme == "w8":
        return QuantizedWeight(q.to(torch.int8), scale8.half()), deq.float()
    return pack_w4(q, scales, zeros), deq.float()
