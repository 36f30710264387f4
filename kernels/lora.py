"""LoRA deltas for a batch that mixes adapters: the torch references of kernels/triton_lora.py.

Every token t of a flattened step carries a slot index (-1: the base model alone). Slot s
holds, for one fused projection of one layer, an adapter's A and B with their rank columns
packed (several adapted sub-projections of q|k|v side by side; B holds the scaling):

    a  [S, C, K]   lora_A rows            y[t] += (x[t] @ a[s].T) @ b[s]    for s = slots[t] >= 0
    b  [S, C, N]   lora_B.T * scaling     (shrink to C columns, then expand onto y's N)

`lora_add_ref` is the definition (a gather per token: for tests at tiny shapes).
`lora_add_groups` serves the layout above slot by slot (the kernel layout's fallback).
`lora_add_blocks` is what the engine runs on a CPU (engine/lora/slots.py, from the step's
plan made on the host), on a layout of its own: B split by the projection's blocks (q | k |
v, gate | up), so the zeros between them are never read (a third of the slot bytes for a
q/k/v/o/gate/up/down adapter). A run of consecutive slots takes a handful of ops whatever its
size: the run's tokens gathered into a [G, Tm, K] block (each slot's tokens, padded to the
most any slot has), one batched shrink against the slots' A (a view: no weight is copied),
padding rows zeroed, one batched expand per block, each index_added back onto y. (Slot by
slot it was four ops per slot and projection: ~2,000 calls a step at 16 adapters, +66% over
the base model in benchmarks/lora.py; the step streams every resident slot's weights once,
so the rest is memory traffic: docs/lora.md.)
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


def lora_add_blocks(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor,
                    blocks: Sequence[tuple[int, int, torch.Tensor]], block_cols: int, lo: int, hi: int,
                    rows: slice | torch.Tensor, mask: torch.Tensor | None, cols: int,
                    ranks: Sequence[int]) -> torch.Tensor:
    """The CPU layout's sum for the tokens of slots lo..hi-1, in one batch.

    The expand is split by the projection's blocks (the rows each PEFT module adds to: q, k
    and v of a fused qkv; gate and up), so no zero block of B is read: block j is
    `(start, stop, b_j)` with b_j [S, R, stop - start], fed by A's columns
    [j * block_cols, j * block_cols + R) (block_cols = max_lora_rank).
    `rows`: with one slot, its token rows (a slice or an index); with G = hi - lo slots, an
    index [G * Tm]: slot by slot, the rows its tokens are on, padded to Tm entries with any
    row of the run, `mask` [G, Tm, 1] 0 on those pads (None: no pads). `cols`: the most A
    columns any of the slots uses; `ranks[j]`: the most columns any uses in block j (0: the
    block is not adapted)."""
    if cols == 0:
        return y
    G = hi - lo
    if isinstance(rows, slice):
        xs = x[rows].unsqueeze(0)
    else:
        xs = x.index_select(0, rows).view(G, -1, x.shape[1])
    xa = torch.bmm(xs, a[lo:hi, :cols].transpose(1, 2))
    if mask is not None:
        xa.mul_(mask)
    for j, (start, stop, b) in enumerate(blocks):
        r = ranks[j]
        if r == 0:
            continue
        c = j * block_cols
        delta = torch.bmm(xa[:, :, c:c + r], b[lo:hi, :r]).view(-1, stop - start)
        if isinstance(rows, slice):
            y[rows, start:stop] += delta
        else:
            y[:, start:stop].index_add_(0, rows, delta)
    return y


def native_lora():
    """The C++ module when its lora_add runs here (AVX-512), else None."""
    from inflight.kernels.cpu_native import native

    mod = native()
    return mod if mod is not None and mod.f32_linear_supported() else None
