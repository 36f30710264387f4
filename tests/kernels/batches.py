"""Random paged-KV batches in the layout of kernels/attention.py, for kernel tests."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PagedBatch:
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor

    def args(self):
        return (self.q, self.k_cache, self.v_cache, self.block_tables, self.seq_lens,
                self.query_start_loc)


def make_batch(seqs: list[tuple[int, int]], *, block_size: int, q_heads: int, kv_heads: int,
               head_dim: int, dtype: torch.dtype, seed: int, shared_blocks: int = 0,
               spare_blocks: int = 3) -> PagedBatch:
    """`seqs` is (cached_len, q_len) per sequence. Blocks are scattered at random over the
    cache; with `shared_blocks`, sequences 0 and 1 share their first blocks (a prefix hit:
    the same block ids in both tables). Cache rows no sequence owns, and the unused tail
    of each last block, hold NaN, so a kernel that reads them fails the comparison."""
    gen = torch.Generator().manual_seed(seed)
    lens = [c + n for c, n in seqs]
    need = [(n + block_size - 1) // block_size for n in lens]
    if shared_blocks:
        assert len(seqs) >= 2 and min(need[0], need[1]) > shared_blocks
        assert min(seqs[0][0], seqs[1][0]) >= shared_blocks * block_size, "shared blocks must be cached"
    total = sum(need) - (shared_blocks if shared_blocks else 0) + spare_blocks
    perm = torch.randperm(total, generator=gen).tolist()
    max_blocks = max(need) + 2
    tables = torch.full((len(seqs), max_blocks), 10**6, dtype=torch.int32)  # pads: never read
    k_cache = torch.full((total, block_size, kv_heads, head_dim), float("nan"), dtype=dtype)
    v_cache = torch.full_like(k_cache, float("nan"))
    flat_k = k_cache.view(total * block_size, kv_heads, head_dim)
    flat_v = v_cache.view(total * block_size, kv_heads, head_dim)
    next_free = 0
    for b, n_blocks in enumerate(need):
        for i in range(n_blocks):
            if b == 1 and i < shared_blocks:
                tables[b, i] = tables[0, i]
                continue
            tables[b, i] = perm[next_free]
            next_free += 1
        for p in range(lens[b]):
            slot = int(tables[b, p // block_size]) * block_size + p % block_size
            if b == 1 and p < shared_blocks * block_size:
                continue
            flat_k[slot] = torch.randn(kv_heads, head_dim, generator=gen).to(dtype)
            flat_v[slot] = torch.randn(kv_heads, head_dim, generator=gen).to(dtype)
    q_lens = [n for _, n in seqs]
    q = torch.randn(sum(q_lens), q_heads, head_dim, generator=gen).to(dtype)
    qsl = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0).to(torch.int32)
    return PagedBatch(q, k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32), qsl)
