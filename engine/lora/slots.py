"""The adapters' weights where the forward reads them: preallocated slot tensors per layer
and fused projection, and one step's plan of which tokens use which slot.

For each layer and each fused projection p of the decoder (qkv, o, gate_up, down) with
input width K and output width N, and S = max_loras slots, two layouts:

The kernel's (CUDA with the Triton kernels: kernels/triton_lora.py reads each token's slot,
so no step launches work per adapter):

    a[p][layer]  [S, C, K]    each slot's lora_A rows, packed     C = SUBMODULES[p] x max_lora_rank
    b[p][layer]  [S, C, N]    lora_B.T x scaling, the same columns

An adapter of q_proj (rank 8) and v_proj (rank 4) fills columns 0-7 and 8-11 of its slot's
qkv tensors; B's columns 0-7 reach only the q rows of the fused output and 8-11 only the
v rows (engine/lora/adapter.py), so one shrink and one expand serve both.

The CPU's (kernels/lora.py lora_add_blocks), where a step's time is the slot weights it
streams from memory: the projection's blocks (q | k | v, gate | up: `projection_blocks`)
each own max_lora_rank columns of A, and B is split by block,

    a[p][layer]            [S, blocks x max_lora_rank, K]
    b_blocks[p][layer][j]  [S, max_lora_rank, rows of block j]

so the zero blocks of the packed B (two thirds of qkv's, half of gate_up's) are neither
stored nor read. Unused columns stay zero in both. Loading an adapter is a copy into its
slot: a step never allocates weights.

A step's plan (`LoraStep`, built by the model runner) says, for the CPU path, which token
rows each slot in use has: runs of consecutive slots served in one batch (LoraRun), the rest
slot by slot (a slice when its rows are contiguous, as a lone request's are); and for the
kernel, every token's slot (-1: the base model alone).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from inflight.engine.lora.adapter import (PROJECTIONS, SUBMODULES, LoraAdapter, LoraError, projection_blocks,
                                          projection_in_features, projection_out_features)
from inflight.engine.model_config import ModelConfig
from inflight.kernels.lora import lora_add_blocks, lora_add_groups


@dataclass
class LoraRun:
    """Consecutive slots lo..hi-1 whose tokens one batched shrink and expand serve
    (kernels/lora.py lora_add_blocks): `idx` [G * Tm] their token rows slot by slot, each
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
    runs: list[LoraRun] = field(default_factory=list)  # slots served in batches (CPU torch path)
    # the C++ path (kernels/csrc/cpu_lora.cpp): the adapter tokens' rows grouped by slot, and
    # (slot, first, end) of each group in them
    order: torch.Tensor | None = None                # [M] int64
    segs: torch.Tensor | None = None                 # [G, 3] int64

    # a run is batched when its padded block holds at most this many times its tokens (a long
    # prompt beside one-token decodes is served slot by slot rather than padded)
    MAX_PAD_RATIO = 2

    @classmethod
    def plan(cls, slots: list[int], num_tokens: list[int], device: torch.device,
             dtype: torch.dtype = torch.float32, batch: bool = True, native: bool = False) -> LoraStep | None:
        """`slots[i]`: request i's slot (-1: none), which has `num_tokens[i]` rows in order.
        None when no request uses an adapter. `batch`: group consecutive slots into runs
        (the CPU torch path; the kernel reads token_slots instead). `native`: only the
        C++ path's order and segments."""
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
        if native:
            order: list[int] = []
            segs: list[tuple[int, int, int]] = []
            for s in used:
                first = len(order)
                for a, b in runs[s]:
                    order.extend(range(a, b))
                segs.append((s, first, len(order)))
            step.order = torch.tensor(order, dtype=torch.int64, device=device)
            step.segs = torch.tensor(segs, dtype=torch.int64, device=device)
            return step
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
        """`kernel`: deltas through kernels/triton_lora.py (CUDA with the Triton kernels),
        on the packed layout above; otherwise the CPU layout (kernels/lora.py
        lora_add_blocks): A with max_rank columns per block of the projection, and B split
        by block, so no zero block of B is stored or read."""
        self.num_slots, self.max_rank, self.dtype, self.kernel = num_slots, max_rank, dtype, kernel
        self.a: dict[str, list[torch.Tensor]] = {}
        self.b: dict[str, list[torch.Tensor]] = {}               # kernel layout only
        # CPU layout: per projection its blocks (first row, end row); per layer, each block's
        # B [S, max_rank, rows]; per layer and block, each slot's rank there (0: none)
        self.blocks: dict[str, list[tuple[int, int]]] = projection_blocks(cfg)
        self.b_blocks: dict[str, list[list[torch.Tensor]]] = {}
        self.ranks: dict[str, list[list[list[int]]]] = {}
        self._spans: dict[str, list[list[tuple[int, int, torch.Tensor]]]] = {}
        # each slot's used A columns per (projection, layer), on the host: the CPU path
        # multiplies by those only, and skips a projection the adapter leaves alone
        self.used: dict[str, list[list[int]]] = {}
        L = cfg.num_layers
        for p in PROJECTIONS:
            K, N = projection_in_features(cfg, p), projection_out_features(cfg, p)
            self.used[p] = [[0] * num_slots for _ in range(L)]
            if kernel:
                C = SUBMODULES[p] * max_rank
                self.a[p] = [torch.zeros(num_slots, C, K, dtype=dtype, device=device) for _ in range(L)]
                self.b[p] = [torch.zeros(num_slots, C, N, dtype=dtype, device=device) for _ in range(L)]
                continue
            C = len(self.blocks[p]) * max_rank
            self.a[p] = [torch.zeros(num_slots, C, K, dtype=dtype, device=device) for _ in range(L)]
            self.b_blocks[p] = [[torch.zeros(num_slots, max_rank, stop - start, dtype=dtype, device=device)
                                 for start, stop in self.blocks[p]] for _ in range(L)]
            self.ranks[p] = [[[0] * num_slots for _ in self.blocks[p]] for _ in range(L)]
            # the torch path's view of the same tensors: (first row, end row, B) per block
            self._spans[p] = [[(start, stop, b) for (start, stop), b in zip(self.blocks[p], bs)]
                              for bs in self.b_blocks[p]]
        if kernel:
            C = max(SUBMODULES.values()) * max_rank
            self._scratch: torch.Tensor | None = None
            self._scratch_cols = C
        # the C++ path (kernels/csrc/cpu_lora.cpp): fp32 on an AVX-512 CPU where every input
        # width and block is a multiple of 16 wide (the models' are; tiny test models may not be)
        self.native = None
        if not kernel and dtype == torch.float32 and device.type == "cpu":
            from inflight.kernels.lora import native_lora

            widths = [projection_in_features(cfg, p) for p in PROJECTIONS]
            widths += [stop - start for p in PROJECTIONS for start, stop in self.blocks[p]]
            self.native = native_lora() if all(w % 16 == 0 for w in widths) else None
        if self.native is not None:
            self.block_starts = {p: torch.tensor([b[0] for b in self.blocks[p]] + [self.blocks[p][-1][1]],
                                                 dtype=torch.int64) for p in PROJECTIONS}
            self.rank_t = {p: [torch.zeros(len(self.blocks[p]), num_slots, dtype=torch.int32) for _ in range(L)]
                           for p in PROJECTIONS}

    def _tensors(self, p: str, layer: int) -> list[torch.Tensor]:
        return [self.a[p][layer]] + ([self.b[p][layer]] if self.kernel else self.b_blocks[p][layer])

    @property
    def bytes_per_slot(self) -> int:
        return sum(t[0].numel() * t.element_size() for p in PROJECTIONS
                   for layer in range(len(self.a[p])) for t in self._tensors(p, layer))

    def load(self, slot: int, adapter: LoraAdapter) -> None:
        """Copy an adapter's weights into `slot` (whatever it held before is cleared)."""
        self.clear(slot)
        R = self.max_rank
        for m in adapter.modules:
            r = m.rank
            if self.kernel:
                c = self.used[m.proj][m.layer][slot]
                self.a[m.proj][m.layer][slot, c:c + r].copy_(m.a)
                self.b[m.proj][m.layer][slot, c:c + r, m.start:m.stop].copy_(m.b.T)
                self.used[m.proj][m.layer][slot] = c + r
                continue
            j = self.blocks[m.proj].index((m.start, m.stop))
            ranks = self.ranks[m.proj][m.layer][j]
            if ranks[slot]:
                raise LoraError(f"adapter {adapter.name!r}: two modules adapt rows "
                                f"{m.start}:{m.stop} of layer {m.layer}'s {m.proj}")
            self.a[m.proj][m.layer][slot, j * R:j * R + r].copy_(m.a)
            self.b_blocks[m.proj][m.layer][j][slot, :r].copy_(m.b.T)
            ranks[slot] = r
            if self.native is not None:
                self.rank_t[m.proj][m.layer][j, slot] = r
            used = self.used[m.proj][m.layer]
            used[slot] = max(used[slot], j * R + r)

    def clear(self, slot: int) -> None:
        for p in PROJECTIONS:
            for layer, used in enumerate(self.used[p]):
                if used[slot]:
                    for t in self._tensors(p, layer):
                        t[slot].zero_()
                    used[slot] = 0
                    if not self.kernel:
                        for ranks in self.ranks[p][layer]:
                            ranks[slot] = 0
                        if self.native is not None:
                            self.rank_t[p][layer][:, slot] = 0

    def apply(self, y: torch.Tensor, x: torch.Tensor, layer: int, proj: str, step: LoraStep) -> torch.Tensor:
        """y (the projection of x) += each token's adapter delta, in place."""
        if self.kernel:
            if step.token_slots is not None:
                from inflight.kernels.triton_lora import lora_add_triton

                a = self.a[proj][layer]
                xa = self._scratch_for(x.shape[0], x.device)[:, :a.shape[1]]
                return lora_add_triton(y, x, a, self.b[proj][layer], step.token_slots, xa)
            return lora_add_groups(y, x, self.a[proj][layer], self.b[proj][layer], step.groups,
                                   self.used[proj][layer])
        if step.order is not None:
            self.native.lora_add(y, x, self.a[proj][layer], self.b_blocks[proj][layer], self.block_starts[proj],
                                 self.rank_t[proj][layer], self.max_rank, step.order, step.segs)
            return y
        a, used, ranks = self.a[proj][layer], self.used[proj][layer], self.ranks[proj][layer]
        blocks, R = self._spans[proj][layer], self.max_rank
        for run in step.runs:
            lo, hi = run.lo, run.hi
            lora_add_blocks(y, x, a, blocks, R, lo, hi, run.idx, run.mask, max(used[lo:hi]),
                            [max(r[lo:hi]) for r in ranks])
        for slot, rows in step.groups:
            lora_add_blocks(y, x, a, blocks, R, slot, slot + 1, rows, None, used[slot],
                            [r[slot] for r in ranks])
        return y

    def _scratch_for(self, T: int, device: torch.device) -> torch.Tensor:
        if self._scratch is None or self._scratch.shape[0] < T:
            self._scratch = torch.empty(max(T, 64), self._scratch_cols, dtype=torch.float32, device=device)
        return self._scratch[:T]
