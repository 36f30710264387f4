"""How many KV blocks fit on the device: what is left of the memory limit once the weights,
the peak of a profiling forward at the largest batch and the CUDA-graph pool are counted.

    limit = kv_cache_memory_fraction x device memory          (all this engine may fill)
          = weights + buffers + peak activations + graph pool + non-torch growth + KV cache

    KV bytes = min(limit - (everything but the KV cache),
                   memory free after profiling - peak activations - graph pool)

The second bound holds when something else shares the device (another process, another
engine in this one): the KV cache never takes memory that is not there. The profiling
forward (engine/profile_run.py) runs the largest step the scheduler can produce:
max_num_batched_tokens tokens of prefill, max_num_seqs rows sampled with top-k / top-p (a
sort over the vocabulary) and logprobs, every prompt row scored for prompt logprobs (in
the LM-head pieces engine/logprobs.py takes). The graph pool is the peak of one padded
decode step at max_num_seqs, run eagerly, plus the graphs' static logits.

The measuring is behind `MemoryProbe`, so the arithmetic and the order of the start-up
(load, profile, size, allocate, capture) run on CPU with a fake probe in tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

GiB = float(1 << 30)


@dataclass(frozen=True)
class MemorySnapshot:
    free: int       # free device memory (the driver's view: all processes)
    total: int      # device memory
    allocated: int  # held by live tensors of this process (torch's allocator)
    reserved: int   # held by torch's allocator, live or cached

    @property
    def used(self) -> int:
        return self.total - self.free


class MemoryProbe(Protocol):
    def snapshot(self) -> MemorySnapshot: ...
    def reset_peak(self) -> None: ...
    def peak_allocated(self) -> int: ...
    def release(self) -> None:
        """Wait for the device, then hand cached, unused memory back to the driver."""


class CudaMemoryProbe:
    def __init__(self, device: torch.device):
        self.device = device

    def snapshot(self) -> MemorySnapshot:
        free, total = torch.cuda.mem_get_info(self.device)
        return MemorySnapshot(free, total, torch.cuda.memory_allocated(self.device),
                              torch.cuda.memory_reserved(self.device))

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def peak_allocated(self) -> int:
        return torch.cuda.max_memory_allocated(self.device)

    def release(self) -> None:
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()


@dataclass(frozen=True)
class KVCachePlan:
    """The figures the KV cache is sized from (bytes), and the result."""

    total: int
    fraction: float
    weights: int            # the model's tensors
    buffers: int            # the model runner's persistent buffers (block table, staging, ...)
    activations: int        # peak of the profiling step above what was allocated before it
    graphs: int             # kept for the CUDA-graph pool (0 when no graphs are captured)
    non_torch: int          # device memory that grew outside torch's allocator (workspaces)
    free: int               # free device memory after profiling, caches handed back
    bytes_per_block: int
    block_size: int

    @property
    def limit(self) -> int:
        return int(self.total * self.fraction)

    @property
    def non_kv(self) -> int:
        return self.weights + self.buffers + self.activations + self.graphs + self.non_torch

    @property
    def kv_bytes(self) -> int:
        return max(0, min(self.limit - self.non_kv, self.free - self.activations - self.graphs))

    @property
    def capped_by_free(self) -> bool:
        """Something else holds memory: the free memory, not the limit, set the size."""
        return self.free - self.activations - self.graphs < self.limit - self.non_kv

    @property
    def num_blocks(self) -> int:
        return self.kv_bytes // self.bytes_per_block

    def describe(self) -> str:
        g = lambda b: f"{b / GiB:.2f} GiB"  # noqa: E731
        line = (f"KV cache: {self.num_blocks} blocks of {self.block_size} tokens = "
                f"{g(self.num_blocks * self.bytes_per_block)} "
                f"({self.num_blocks * self.block_size} tokens); weights {g(self.weights)}, "
                f"peak activations {g(self.activations)} (profiled), CUDA graphs {g(self.graphs)}, "
                f"buffers {g(self.buffers)}, non-torch {g(self.non_torch)}; limit "
                f"{self.fraction:g} x {g(self.total)} = {g(self.limit)} "
                "(EngineConfig.kv_cache_memory_fraction)")
        if self.capped_by_free:
            line += (f"; capped by the {g(self.free)} free after profiling (another process or "
                     "engine holds memory on this device)")
        return line

    def shortfall(self) -> str:
        """Why not even one block fits, and what to change."""
        g = lambda b: f"{b / GiB:.2f} GiB"  # noqa: E731
        return (f"no room for the KV cache on this device: weights {g(self.weights)} + peak "
                f"activations {g(self.activations)} + CUDA graphs {g(self.graphs)} + buffers "
                f"{g(self.buffers)} + non-torch {g(self.non_torch)} leave "
                f"{g(max(0, self.kv_bytes))} of the {g(self.limit)} limit "
                f"(kv_cache_memory_fraction={self.fraction:g} x {g(self.total)}; "
                f"{g(self.free)} free), less than one KV block ({self.bytes_per_block} bytes): "
                "raise kv_cache_memory_fraction, lower max_num_batched_tokens or max_num_seqs "
                "(smaller profiled step), or set kv_cache_bytes / num_kv_blocks")


def plan_kv_cache(start: MemorySnapshot, after_weights: MemorySnapshot,
                  before_profile: MemorySnapshot, after_profile: MemorySnapshot, *,
                  activations: int, graphs: int, fraction: float, bytes_per_block: int,
                  block_size: int) -> KVCachePlan:
    """The plan from four snapshots: before the weights, after them, with the runner's
    buffers built (before the profiling KV cache), and after profiling with the profiling
    KV cache freed and caches handed back."""
    weights = max(0, after_weights.allocated - start.allocated)
    buffers = max(0, before_profile.allocated - after_weights.allocated)
    # what the device lost that torch's allocator does not account for (cuBLAS and Triton
    # workspaces, module images); what other processes took meanwhile lands here too
    non_torch = max(0, (after_profile.used - start.used) - (after_profile.reserved - start.reserved))
    return KVCachePlan(start.total, fraction, weights, buffers, activations, graphs, non_torch,
                       after_profile.free, bytes_per_block, block_size)
