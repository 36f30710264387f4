"""The adapters' weights where the forward reads them: preallocated slot tensors per layer
and fused projection, and one step's plan of which tokens use which slot.

For each layer and each fused projection p of the decoder (qkv, o, gate_up, down) with
input width K and output width N, and S = max_loras slots:

    a[p][layer]  [S, C, K]    each slot's lora_A rows, packed     C = SUBMODULES[p] x max_lora_rank
    b[p][layer]  [S, C, N]    lora_B.T x scaling, the same columns

An adapter of q_proj (rank 8) and v_proj (rank 4) fills columns 0-7 and 8-11 of its slot's
qkv tensors; B's columns 0-7 reach only the q rows of the fused output and 8-11 only the
v rows (engine/lora/adapter.py), so one shrink and one expand serve both. Unused columns
stay zero. Loading an adapter is a copy into its slot: a step never allocates, and no
step launches work per adapter on CUDA (kernels/triton_lora.py reads each token's slot).

A step's plan (`LoraStep`, built by the model runner) says, for the CPU path, which token
rows each slot in use has: runs of consecutive slots served in one batch (LoraRun), the rest
slot by slot (a slice when its rows are contiguous, as a lone request's are); and for the
kernel, every token's slot (-1: the base model alone).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from inflight.engine.lora.adapter import (PROJECTIONS, SUBMODULES, LoraAdapter, projection_in_features,
                                          projection_out_features)
from inflight.engine.model_config import ModelConfig
from inflight.kernels.lora import lora_add_batched, lora_add_groups


@dataclass
class LoraRun:
    """Consecutive slots lo..hi-1 whose tokens one batched shrink and expand serve
    (kernels/lora.py lora_add_batched): `idx` [G * Tm] their token rows slot by slot, each
    padded to Tm with a row of the run; `mask` [G, Tm, 1] 0 on the pads (None: no pads)."""

    lo: int
    hi: int
    idx: torch.Tensor
    mask: torch.Tensor | None


@dataclass
class LoraStep:
    """Which tokens of one step use which slot."""

    groups: list[tuple[int, slice | torch.Tensor]]   # (slot, its token rows): slots served one by one
    token_slots: torch.Tensor | None = None          # [T] int32 on the device (kernel path)
    runs: list[LoraRun] = field(default_factory=list)  # slots served in batches (CPU path)

    # a run is batched when its padded block holds at most this many times its tokens (a long
    # prompt beside one-token decodes is served slot by slot rather than padded)
    MAX_PAD_RATIO = 2

    @classmethod
    def plan(cls, slots: list[int], num_tokens: list[int], device: torch.device,
             dtype: torch.dtype = torch.float32, batch: bool = True) -> LoraStep | None:
        """`slots[i]`: request i's slot (-1: none), which has `num_tokens[i]` rows in order.
        None when no request uses an adapter. `batch`: group consecutive slots into runs
        (the CPU path; the kernel reads token_slots instead)."""
        runs: dict[int, list[tuple[int, int]]] = {}
        pos = 0
        for slot, k in zip(slots, num_tokens):
            if slot >= 0:
                spans = runs.setdefault(slot, [])
                if spans and spans[-1][1] == pos:
                    spans[-1] = (spans[-1][0], pos + k)
                else:
                    spans.append((pos, pos + k))
            pos += k
        if not runs:
            return None
        step = cls([])
        used = sorted(runs)
        start = 0
        for i in range(1, len(used) + 1):  # maximal runs of consecutive slot numbers
            if i < len(used) and used[i] == used[i - 1] + 1:
                continue
            run = used[start:i]
            start = i
            rows = [[t for a, b in runs[s] for t in range(a, b)] for s in run]
            tm = max(map(len, rows))
            total = sum(map(len, rows))
            if batch and len(run) > 1 and len(run) * tm <= cls.MAX_PAD_RATIO * total:
                idx = [t for r in rows for t in r + [r[0]] * (tm - len(r))]
                mask = None
                if len(run) * tm != total:
                    mask = torch.tensor([[[1.0]] * len(r) + [[0.0]] * (tm - len(r)) for r in rows],
                                        dtype=dtype, device=device)
                step.runs.append(LoraRun(run[0], run[-1] + 1,
                                         torch.tensor(idx, dtype=torch.int64, device=device), mask))
                continue
            for s, r in zip(run, rows):
                spans = runs[s]
                step.groups.append((s, slice(*spans[0]) if len(spans) == 1 else
                                    torch.tensor(r, dtype=torch.int64, device=device)))
        return step


class LoraSlots:
    def __init__(self, cfg: ModelConfig, num_slots: int, max_rank: int, dtype: torch.dtype,
                 device: torch.device, kernel: bool = False):
        """`kernel`: deltas through kernels/triton_lora.py (CUDA with the Triton kernels)."""
        self.num_slots, self.max_rank, self.dtype, self.kernel = num_slots, max_rank, dtype, kernel
        self.a: dict[str, list[torch.Tensor]] = {}
        self.b: dict[str, list[torch.Tensor]] = {}
        # host copies of each slot's used columns per (projection, layer): the CPU path
        # multiplies by those only, and skips a projection the adapter leaves alone
        self.used: dict[str, list[list[int]]] = {}
        for p in PROJECTIONS:
            C = SUBMODULES[p] * max_rank
            K, N = projection_in_features(cfg, p), projection_out_features(cfg, p)
            self.a[p] = [torch.zeros(num_slots, C, K, dtype=dtype, device=device) for _ in range(cfg.num_layers)]
            self.b[p] = [torch.zeros(num_slots, C, N, dtype=dtype, device=device) for _ in range(cfg.num_layers)]
            self.used[p] = [[0] * num_slots for _ in range(cfg.num_layers)]
        if kernel:
            C = max(SUBMODULES.values()) * max_rank
            self._scratch: torch.Tensor | None = None
            self._scratch_cols = C

    @property
    def bytes_per_slot(self) -> int:
        return sum(t[0].numel() * t.element_size() for p in PROJECTIONS for t in self.a[p] + self.b[p])

    def load(self, slot: int, adapter: LoraAdapter) -> None:
        """Copy an adapter's weights into `slot` (whatever it held before is cleared)."""
        self.clear(slot)
        for m in adapter.modules:
            c = self.used[m.proj][m.layer][slot]
            r = m.rank
            self.a[m.proj][m.layer][slot, c:c + r].copy_(m.a)
            self.b[m.proj][m.layer][slot, c:c + r, m.start:m.stop].copy_(m.b.T)
            self.used[m.proj][m.layer][slot] = c + r

    def clear(self, slot: int) -> None:
        for p in PROJECTIONS:
            for layer, used in enumerate(self.used[p]):
                if used[slot]:
                    self.a[p][layer][slot].zero_()
                    self.b[p][layer][slot].zero_()
                    used[slot] = 0

    def apply(self, y: torch.Tensor, x: torch.Tensor, layer: int, proj: str, step: LoraStep) -> torch.Tensor:
        """y (the projection of x) += each token's adapter delta, in place."""
        if self.kernel and step.token_slots is not None:
            from inflight.kernels.triton_lora import lora_add_triton

            a = self.a[proj][layer]
            xa = self._scratch_for(x.shape[0], x.device)[:, :a.shape[1]]
            return lora_add_triton(y, x, a, self.b[proj][layer], step.token_slots, xa)
        a, b, used = self.a[proj][layer], self.b[proj][layer], self.used[proj][layer]
        for run in step.runs:
            lora_add_batched(y, x, a, b, run.lo, run.hi, run.idx, run.mask, max(used[run.lo:run.hi]))
        return lora_add_groups(y, x, a, b, step.groups, used)

    def _scratch_for(self, T: int, device: torch.device) -> torch.Tensor:
        if self._scratch is None or self._scratch.shape[0] < T:
            self._scratch = torch.empty(max(T, 64), self._scratch_cols, dtype=torch.float32, device=device)
        return self._scratch[:T]
