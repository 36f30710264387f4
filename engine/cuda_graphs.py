"""Decode steps on static, padded buffers: CUDA graphs on CUDA, the same code eagerly elsewhere.

A step whose every request decodes one token runs at a padded batch size P (1, 2, 4, 8,
then multiples of 8 up to max_num_seqs): its inputs are copied into fixed buffers, rows
n..P-1 are padding (they point at the batch's all-zero pad row, have context length 0,
and write no K/V), and the forward for P rows runs on those buffers:

    inputs [4, P_max] int32:   rows | seq_lens | token ids | source index (-1 = token id)
    logits [P, vocab]          rows 0..n-1 are the step's

On CUDA each P is captured once at start-up (largest first, one memory pool for all) and
replayed; the forward then costs one launch instead of ~10 per layer. Elsewhere (CPU
tests) `run` calls the same body eagerly ("eager replay"), so everything but the capture
itself is exercised by the CPU test suite.

NOTE: the body may hold no host work that a graph cannot replay: no host syncs
(`.tolist()`, `.item()`), no shapes that depend on values. The Triton kernel path holds
none; the torch path syncs, so on CUDA graphs need the Triton kernels.
"""

from __future__ import annotations

import bisect
import logging
import time
from typing import Callable

import torch

log = logging.getLogger(__name__)


def graph_sizes(max_num_seqs: int) -> list[int]:
    """Padded batch sizes: 1, 2, 4, 8, then every multiple of 8, and max_num_seqs itself."""
    sizes = [s for s in (1, 2, 4, 8) if s < max_num_seqs]
    sizes += range(16, max_num_seqs, 8)
    return sizes + [max_num_seqs]


class DecodeGraphs:
    def __init__(self, max_num_seqs: int, device: torch.device,
                 body: Callable[[torch.Tensor], torch.Tensor], vocab_size: int):
        """`body(inputs[:, :P])` runs the padded forward and returns fp32 logits [P, vocab]."""
        self.sizes = graph_sizes(max_num_seqs)
        self.device = device
        self.body = body
        self.inputs = torch.zeros((4, self.sizes[-1]), dtype=torch.int32, device=device)
        self.vocab_size = vocab_size
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: torch.Tensor | None = None  # [P_max, vocab], written by every graph
        self.num_replays = 0
        self.num_eager = 0

    def padded_size(self, n: int) -> int | None:
        """The smallest size >= n, or None when n is larger than every size."""
        i = bisect.bisect_left(self.sizes, n)
        return self.sizes[i] if i < len(self.sizes) else None

    def clear_inputs(self, pad_row: int) -> None:
        """Padding values everywhere (capture and warm-up run on them)."""
        self.inputs[0].fill_(pad_row)
        self.inputs[1].zero_()
        self.inputs[2].zero_()
        self.inputs[3].fill_(-1)

    @torch.inference_mode()
    def capture(self, pad_row: int) -> None:
        """Capture one CUDA graph per padded size, largest first, into one memory pool."""
        assert self.device.type == "cuda", "CUDA graphs need a CUDA device"
        t0 = time.perf_counter()
        self.clear_inputs(pad_row)
        self.logits = torch.empty((self.sizes[-1], self.vocab_size), dtype=torch.float32,
                                  device=self.device)
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for i, size in enumerate(reversed(self.sizes)):
                for _ in range(2):  # compile the kernels and settle the allocator first
                    self.logits[:size].copy_(self.body(self.inputs[:, :size]))
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    self.logits[:size].copy_(self.body(self.inputs[:, :size]))
                self.graphs[size] = graph
                if (i + 1) % 8 == 0 or i + 1 == len(self.sizes):
                    log.info("CUDA graphs: captured %d/%d decode sizes (%.1fs)", i + 1,
                             len(self.sizes), time.perf_counter() - t0)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        torch.cuda.synchronize(self.device)

    def run(self, size: int) -> torch.Tensor:
        """Logits [size, vocab] of the padded step whose inputs are in `inputs[:, :size]`."""
        graph = self.graphs.get(size)
        if graph is not None:
            graph.replay()
            self.num_replays += 1
            return self.logits[:size]
        self.num_eager += 1
        return self.body(self.inputs[:, :size])
