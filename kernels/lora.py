"""LoRA deltas for a batch that mixes adapters: the torch references of kernels/triton_lora.py.

Every token t of a flattened step carries a slot index (-1: the base model alone). Slot s
holds, for one fused projection of one layer, an adapter's A and B with their rank columns
packed (several adapted sub-projections of q|k|v side by side; B holds the scaling):

    a  [S, C, K]   lora_A rows            y[t] += (x[t] @ a[s].T) @ b[s]    for s = slots[t] >= 0
    b  [S, C, N]   lora_B.T * scaling     (shrink to C columns, then expand onto y's N)

`lora_add_ref` is the definition (a gather per token: for tests at tiny shapes).
`lora_add_groups` is what the engine runs on a CPU: the tokens of one slot, known on the
host when the step is planned (a slice when they are contiguous, an index tensor when not),
take two small matmuls over that slot's used columns only.
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
