"""The persistent input batch: rows follow admit / finish / preempt / resume / abort, block
tables change by diffs only, and a freed row is never read (freed rows are poisoned)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from inflight.engine.input_batch import POISON, InputBatch
from inflight.engine.request import Request
from inflight.engine.sampling_params import SamplingParams

GREEDY = SamplingParams(max_tokens=4, temperature=0.0)


def req(name, blocks, params=GREEDY):
    r = Request(name, [1, 2, 3], params)
    r.block_ids = list(blocks)
    return r


def device_table(batch: InputBatch, dev: torch.Tensor) -> torch.Tensor:
    """Apply the pending diffs to a separate 'device' table, as the runner does."""
    out = np.zeros(3 * batch.num_diff_entries, dtype=np.int32)
    d = batch.take_diffs(out)
    if d:
        r, c, v = (torch.from_numpy(out[i * d:(i + 1) * d]) for i in range(3))
        dev[r.long(), c.long()] = v
    return dev


def test_rows_follow_admit_finish_preempt_resume_abort():
    b = InputBatch(max_rows=3, max_blocks_per_row=6, device=torch.device("cpu"), poison=True)
    a, c, d = req("a", [7, 8]), req("c", [9]), req("d", [4, 5, 6])
    assert [b.add(x) for x in (a, c, d)] == [0, 1, 2]
    assert b.block_table[0, :2].tolist() == [7, 8] and b.block_table[2, :3].tolist() == [4, 5, 6]
    with pytest.raises(RuntimeError, match="full"):
        b.add(req("e", [1]))
    with pytest.raises(ValueError, match="already holds"):
        b.add(a)

    b.remove(c)                                   # finish
    assert (b.block_table[1] == POISON).all() and c not in b.row_of
    e = req("e", [11, 12])                        # admitted into the freed row, rest zeroed
    assert b.add(e) == 1
    assert b.block_table[1].tolist() == [11, 12, 0, 0, 0, 0]

    a.block_ids.append(13)                        # a decode crossed into a new block
    b.append_blocks(a, b.row_of[a])
    assert b.block_table[0, :3].tolist() == [7, 8, 13] and b.num_blocks[0] == 3

    b.remove(a)                                   # preempted: blocks freed, row poisoned
    assert (b.block_table[0] == POISON).all()
    a.block_ids = [20, 21, 22, 23]                # resumed later with other blocks
    assert b.add(a) == 0 and b.block_table[0, :4].tolist() == [20, 21, 22, 23]

    b.remove(d)                                   # aborted
    b.remove(d)                                   # twice: ignored
    assert len(b.row_of) == 2 and set(b.row_of.values()) == {0, 1}
    assert b.block_table[b.pad_row].tolist() == [0] * 6  # the padding row stays zeros


def test_sampling_parameters_follow_rows():
    b = InputBatch(max_rows=4, max_blocks_per_row=2, device=torch.device("cpu"))
    g = req("g", [1])
    t = req("t", [2], SamplingParams(temperature=0.7, top_k=5))
    p = req("p", [3], SamplingParams(temperature=1.3, top_p=0.9))
    rows = np.array([b.add(x) for x in (g, t, p)], dtype=np.int32)
    assert (b.num_random, b.num_top_k, b.num_top_p) == (2, 1, 1)
    temp, top_k, top_p = b.sampling_arrays(rows)
    assert temp.tolist() == pytest.approx([0.0, 0.7, 1.3])
    assert top_k.tolist() == [0, 5, 0] and top_p.tolist() == pytest.approx([1.0, 1.0, 0.9])
    assert b.sampling_arrays(rows[:1])[1:] == (None, None)  # only the greedy row scheduled
    b.remove(t)
    b.remove(p)
    assert (b.num_random, b.num_top_k, b.num_top_p) == (0, 0, 0)


@pytest.mark.parametrize("seed", range(3))
def test_device_table_equals_host_through_diffs(seed):
    """Random admits, block appends and removals; after each 'step' the diffs bring a
    separate device table to the host table's value on every live row."""
    rng = random.Random(seed)
    b = InputBatch(max_rows=8, max_blocks_per_row=10, device=torch.device("cpu"), poison=True,
                   shared=False)
    dev = torch.zeros_like(torch.from_numpy(b.block_table))
    live: list[Request] = []
    used: set[int] = set()
    for step in range(200):
        for _ in range(rng.randint(0, 3)):
            op = rng.random()
            if op < 0.4 and len(live) < 8:
                r = req(f"r{step}-{len(live)}", [rng.randrange(1000) for _ in range(rng.randint(1, 4))])
                used.add(b.add(r))
                live.append(r)
            elif op < 0.8 and live:
                r = rng.choice(live)
                if len(r.block_ids) < 10:
                    r.block_ids.append(rng.randrange(1000))
                    b.append_blocks(r, b.row_of[r])
            elif live:
                r = live.pop(rng.randrange(len(live)))
                b.remove(r)
        device_table(b, dev)
        for r in live:
            row = b.row_of[r]
            n = len(r.block_ids)
            assert dev[row, :n].tolist() == r.block_ids == b.block_table[row, :n].tolist()
        for row in set(range(8)) - set(b.row_of.values()):  # free: poisoned once used
            assert (dev[row] == (POISON if row in used else 0)).all()
    b.resync()  # a failed step: every live row is sent again, whole
    dev.fill_(-1)
    device_table(b, dev)
    for r in live:
        assert dev[b.row_of[r]].tolist() == b.block_table[b.row_of[r]].tolist()
