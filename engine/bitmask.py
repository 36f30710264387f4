"""Token bitmasks of constrained sequences: filled on the host, applied on the device.

One step's masks travel in one int32 buffer, copied to the device in one copy:

    [ logits row of constrained sequence 0 .. k-1 | k x W bitmask words ]

(W = ceil(vocab / 32); bit t of a row's words = token t allowed). On the device one
operation per step masks all k rows: the words are unpacked to booleans and every
forbidden token's logit becomes -inf, before sampling, so greedy, temperature, top-k/top-p
and seeded draws all pick among the allowed tokens only (a seeded request draws the same
random numbers as without the mask: its draws never depend on the batch).

NOTE: the model runner calls `apply` after the forward pass is queued on the device, so on
a GPU the host fills the masks while the device computes the logits.
"""

from __future__ import annotations

import time

import torch

from inflight.engine.grammar import GrammarCompiler, GrammarMatcher, fill_bitmasks
from inflight.engine.staging import Staging


class BitmaskStage:
    def __init__(self, compiler: GrammarCompiler, max_rows: int, device: torch.device, *,
                 separate: bool, stream: torch.cuda.Stream | None):
        self.compiler = compiler
        self.words = compiler.words_per_row()
        self.staging = Staging(max_rows * (self.words + 1), device, separate=separate,
                               stream=stream)
        self.bits = (torch.ones(32, dtype=torch.int64) << torch.arange(32)).to(
            torch.int32).to(device)  # 1 << 31 wraps to the sign bit, as in the words
        self.host_s = 0.0   # host wall time filling masks, all steps
        self.host_cpu_s = 0.0  # the same in this thread's CPU time (steadier when loaded)
        self.rows = 0       # masks filled, all steps

    def apply(self, logits: torch.Tensor, jobs: list[tuple[int, GrammarMatcher]]) -> None:
        """Mask `logits` [n, V] in place: row i of each (i, matcher) to what its grammar allows."""
        t0, c0 = time.perf_counter(), time.thread_time()
        k, W = len(jobs), self.words
        buf = self.staging.host(k * (W + 1))
        buf[:k] = [i for i, _ in jobs]
        words = buf[k:k + k * W]
        fill_bitmasks(self.compiler.executor, [(g, j) for j, (_, g) in enumerate(jobs)],
                      words.ctypes.data, W, k)
        dev = self.staging.send(k * (W + 1))
        self.host_s += time.perf_counter() - t0
        self.host_cpu_s += time.thread_time() - c0
        self.rows += k
        rows = dev[:k].long()
        allowed = (dev[k:k + k * W].view(k, W, 1) & self.bits) != 0
        V = logits.shape[1]
        allowed = allowed.view(k, W * 32)[:, :V]
        sub = logits.index_select(0, rows)
        sub.masked_fill_(~allowed, float("-inf"))
        logits.index_copy_(0, rows, sub)
