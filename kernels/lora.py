"""LoRA deltas for a batch that mixes adapters: the torch references of kernels/triton_lora.py.

Every token t of a flattened step carries a slot index (-1: the base model alone). Slot s
holds, for one fused projection of one layer, an adapter's A and B with their rank columns
packed (several adapted sub-projections of q|k|v side by side; B holds the scaling):

    a  [S, C, K]   lora_A rows            y[t] += (x[t] @ a[s].T) @ b[s]    for s = slots[t] >= 0
    b  [S, C, N]   lora_B.T * scaling     (shrink to C columns, then expand onto y's N)

`lora_add_ref` is the definition (a gather per token: for tests at tiny shapes).
`lora_add_groups` and `lora_add_batched` are what the engine runs on a CPU, from the step's
plan made on the host (engine/lora/slots.py). Groups: the tokens of one slot (a slice when
they are contiguous, an index tensor when not) take two small matmuls over that slot's used
columns; that is four ops per slot and projection, which at 16 adapters and 30 layers was
~2,000 op calls a step (+66% over the base model in benchmarks/lora.py). Batched: a run of
consecutive slots s0..s1 takes five ops whatever its size: the run's tokens gathered into a
[G, Tm, K] block (each slot's tokens, padded to the most any slot has), one batched shrink
against the slots' A (a view: no weight is copied), padding rows zeroed, one batched expand,
one index_add back onto y.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F


def check_lora_shapes(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    T, K = x.shape
    S, C, N = b.shape
    if a.shape != (S, C, K) or y.shape != (T, N):
        raise ValueError(f"LoRA shapes do not agree: y {tuple(y.shape)}, x {tuple(x.shape)}, "
                         f"a {tuple(a.shape)} (want [S, C, K]), b {tuple(b.shape)} (want [S, C, N])")


def lora_add_ref(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                 slots: torch.Tensor) -> torch.Tensor:
    """y[t] += (x[t] @ a[slots[t]].T) @ b[slots[t]] where slots[t] >= 0; y in place."""
    check_lora_shapes(y, x, a, b)
    on = slots >= 0
    idx = slots.clamp(min=0).long()
    xa = torch.einsum("tk,tck->tc", x.float(), a[idx].float())
    delta = torch.einsum("tc,tcn->tn", xa, b[idx].float()) * on[:, None]
    y += delta.to(y.dtype)
    return y


def lora_add_groups(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                    groups: Sequence[tuple[int, slice | torch.Tensor]], used: Sequence[int]) -> torch.Tensor:
    """The same sum, by the step's slot groups: (slot, its token rows) for each slot some
    token uses; `used[s]`: slot s's packed columns here (0: this projection is not adapted)."""
    for slot, rows in groups:
        c = used[slot]
        if c == 0:
            continue
        delta = F.linear(x[rows], a[slot, :c]) @ b[slot, :c]
        if isinstance(rows, slice):
            y[rows] += delta
        else:
            y.index_add_(0, rows, delta)
    return y


def lora_add_batched(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                     lo: int, hi: int, idx: torch.Tensor, mask: torch.Tensor | None, cols: int) -> torch.Tensor:
    """The same sum for the tokens of slots lo..hi-1 in one batch: `idx` [G * Tm] holds,
    slot by slot, the rows of x each slot's tokens are on, padded to Tm entries with any row
    of the run; `mask` [G, Tm, 1] is 0 on those pads (None: no pads); `cols`: the most
    packed columns any of the slots uses here (0: nothing to add)."""
    if cols == 0:
        return y
    G = hi - lo
    xs = x.index_select(0, idx).view(G, -1, x.shape[1])
    xa = torch.bmm(xs, a[lo:hi, :cols].transpose(1, 2))
    if mask is not None:
        xa.mul_(mask)
    delta = torch.bmm(xa, b[lo:hi, :cols])
    return y.index_add_(0, idx, delta.view(-1, y.shape[1]))
