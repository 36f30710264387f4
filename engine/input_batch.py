"""The persistent input batch: one row per running request, updated by diffs.

A request takes a free row when it first runs (admitted, or resumed after preemption) and
gives it back when it stops running (finished, aborted, preempted). The row holds what
stays put between steps, so a step sends only what changed:

    block_table  [R + 1, M] int32   the request's block ids (append-only while it runs);
                                    row R is all zeros: padded graph rows point at it
    num_blocks   [R + 1]            block ids already written per row (host bookkeeping)
    temperature / top_k / top_p [R] sampling parameters, read when some row samples randomly

    step:   rows = [row of each scheduled request]      (schedule order, not row order)
            block_table_dev[rows]  -> the step's block tables, gathered on the device

The host table is the truth; on CUDA a device twin is kept equal by applying the diffs
(`take_diffs`: row, column, block id) inside the step's one host-to-device copy. On CPU
the device table is the host table itself (no copy at all).

NOTE: a freed row is never read: only rows of scheduled requests are gathered. With
`poison` on (the engine's debug_checks), freed rows are filled with POISON, a block id far
outside any cache, so a step that did read one fails loudly (index out of range). Columns
past a row's own blocks may be read as padding (the torch attention gathers whole rows
and masks): they hold stale but valid ids (zeros when poisoning).
"""

from __future__ import annotations

import numpy as np
import torch

from inflight.engine.request import Request

POISON = 1 << 30


def uses_step_features(req: Request) -> bool:
    """Does req need more than its token each step (a grammar mask, logprobs)?"""
    return req.grammar is not None or req.logprobs is not None or req.prompt_logprobs is not None


class InputBatch:
    def __init__(self, max_rows: int, max_blocks_per_row: int, device: torch.device,
                 poison: bool = False, shared: bool | None = None):
        """`shared`: the device table is the host table (default: on CPU). False on CPU keeps
        a separate table updated by diffs, as on CUDA (tests)."""
        self.max_rows = max_rows
        self.max_blocks_per_row = max_blocks_per_row
        self.pad_row = max_rows
        self.poison = poison
        self.block_table = np.zeros((max_rows + 1, max_blocks_per_row), dtype=np.int32)
        self.shared = device.type == "cpu" if shared is None else shared
        self.block_table_dev = (torch.from_numpy(self.block_table) if self.shared else
                                torch.zeros(self.block_table.shape, dtype=torch.int32, device=device))
        self.num_blocks = [0] * (max_rows + 1)
        self.temperature = np.zeros(max_rows, dtype=np.float32)
        self.top_k = np.zeros(max_rows, dtype=np.int32)     # 0 = off
        self.top_p = np.ones(max_rows, dtype=np.float32)
        self.row_of: dict[Request, int] = {}
        self._free = list(range(max_rows - 1, -1, -1))  # a stack: the lowest free row on top
        self.num_random = 0  # rows with temperature > 0
        self.num_top_k = 0
        self.num_top_p = 0
        # rows whose request uses a per-step feature (grammar, logprobs, prompt logprobs):
        # while there are none, a step never asks a request about them (engine/step_inputs.py)
        self.num_featured = 0
        # device diffs not sent yet: (row, first column, block ids)
        self._diffs: list[tuple[int, int, list[int]]] = []
        self.num_diff_entries = 0
        # engine/logits_processors.LogitsProcessors: told of every row taken and freed
        self.procs = None

    # -- rows ----------------------------------------------------------------------------
    def add(self, req: Request) -> int:
        """Give a newly running request a row; write its block table and parameters."""
        if req in self.row_of:
            raise ValueError(f"request {req.request_id!r} already holds row {self.row_of[req]}")
        if not self._free:
            raise RuntimeError(f"input batch full ({self.max_rows} rows): the scheduler ran "
                               "more requests than max_num_seqs")
        row = self._free.pop()
        self.row_of[req] = row
        self.num_blocks[row] = 0
        if self.poison:
            # columns past a request's blocks may be read as padding (masked): not poison
            self.block_table[row] = 0
            if not self.shared:
                self._push(row, 0, [0] * self.max_blocks_per_row)
        self.append_blocks(req, row)
        p = req.params
        random = p.temperature > 0
        self.temperature[row] = p.temperature
        self.top_k[row] = p.top_k if p.uses_top_k else 0
        self.top_p[row] = p.top_p
        self.num_random += random
        self.num_top_k += random and p.uses_top_k
        self.num_top_p += random and p.uses_top_p
        self.num_featured += uses_step_features(req)
        if self.procs is not None and p.uses_logits_processors:
            self.procs.add(req, row)
        return row

    def remove(self, req: Request) -> None:
        """Free req's row (finished, aborted or preempted); unknown requests are ignored."""
        row = self.row_of.pop(req, None)
        if row is None:
            return
        p = req.params
        random = p.temperature > 0
        self.num_random -= random
        self.num_top_k -= random and p.uses_top_k
        self.num_top_p -= random and p.uses_top_p
        self.num_featured -= uses_step_features(req)
        if self.procs is not None and p.uses_logits_processors:
            self.procs.remove(req)
        if self.poison:
            self.block_table[row] = POISON
            if not self.shared:
                self._push(row, 0, [POISON] * self.max_blocks_per_row)
        self.num_blocks[row] = 0
        self._free.append(row)

    def truncate(self, req: Request) -> None:
        """req gave back its tail blocks (KVCacheManager.trim after a speculative
        verification): forget them, so the blocks it gains next are written again."""
        row = self.row_of.get(req)
        if row is None:
            return
        old, new = self.num_blocks[row], len(req.block_ids)
        if new >= old:
            return
        self.num_blocks[row] = new
        if self.poison:  # the freed blocks may be another request's soon: padding ids
            self.block_table[row, new:old] = 0
            if not self.shared:
                self._push(row, new, [0] * (old - new))

    def append_blocks(self, req: Request, row: int) -> None:
        """Write the block ids req gained since its row was last written."""
        old, ids = self.num_blocks[row], req.block_ids
        new = len(ids)
        if new == old:
            return
        if new > self.max_blocks_per_row:
            raise RuntimeError(f"request {req.request_id!r} holds {new} blocks, more than a "
                               f"block-table row ({self.max_blocks_per_row})")
        added = ids[old:]
        self.block_table[row, old:new] = added
        self.num_blocks[row] = new
        if not self.shared:
            self._push(row, old, added)

    def _push(self, row: int, col: int, ids: list[int]) -> None:
        self._diffs.append((row, col, ids))
        self.num_diff_entries += len(ids)

    def resync(self) -> None:
        """Queue every live row whole (after a failed step lost its diffs)."""
        if self.shared:
            return
        self._diffs.clear()
        self.num_diff_entries = 0
        for row in self.row_of.values():
            self._push(row, 0, self.block_table[row].tolist())

    def take_diffs(self, out: np.ndarray) -> int:
        """Write the pending device diffs into `out` as [rows | cols | ids] (3 x D int32)
        and forget them; returns D."""
        d = self.num_diff_entries
        if not d:
            return 0
        pos = 0
        for row, col, ids in self._diffs:
            k = len(ids)
            out[pos:pos + k] = row
            out[d + pos:d + pos + k] = np.arange(col, col + k, dtype=np.int32)
            out[2 * d + pos:2 * d + pos + k] = ids
            pos += k
        self._diffs.clear()
        self.num_diff_entries = 0
        return d

    def apply_diffs(self, diffs: torch.Tensor) -> None:
        """Write a step's diffs (`take_diffs`' [rows | cols | ids], now on the device) into
        the device table (a separate one: CUDA, or CPU tests)."""
        d = diffs.shape[0] // 3
        if d and not self.shared:
            diffs = diffs.view(3, d)
            self.block_table_dev[diffs[0].long(), diffs[1].long()] = diffs[2]

    # -- sampling parameters of one step ---------------------------------------------------
    def sampling_arrays(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """temperature, top_k (None if no row uses it), top_p (likewise) of `rows`."""
        top_k = self.top_k[rows] if self.num_top_k else None
        if top_k is not None and not top_k.any():
            top_k = None
        top_p = self.top_p[rows] if self.num_top_p else None
        if top_p is not None and (top_p >= 1.0).all():
            top_p = None
        return self.temperature[rows], top_k, top_p
