"""Triton unified paged attention against the torch reference, under the interpreter on CPU."""

import random

import pytest
import torch

from inflight.kernels.attention import paged_attention_ref, paged_attention_torch
from inflight.kernels.triton_attention import _choose_num_splits, paged_attention_triton
from tests.kernels.batches import make_batch

TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.float16: dict(atol=4e-3, rtol=4e-3)}
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def check(batch, dtype, num_splits=None):
    args = [t.to(DEVICE) for t in batch.args()]
    scale = batch.q.shape[-1] ** -0.5
    out = paged_attention_triton(*args, scale, num_splits=num_splits)
    ref = paged_attention_ref(*args, scale)
    assert not out.isnan().any()
    torch.testing.assert_close(out.float(), ref.float(), **TOL[dtype])


# (cached_len, q_len) per sequence, block size 16: decodes whose context ends mid-block (40)
# and exactly on a block edge (16, 32), a prefill chunk after a prefix, a fresh prefill, and
# sequences 0 and 1 sharing their first two cached blocks.
MIXED = [(35, 5), (39, 1), (0, 9), (15, 1), (31, 1), (20, 12)]


@pytest.mark.parametrize("dtype,head_dim,q_heads,kv_heads", [
    (torch.float32, 64, 8, 2),     # GQA 4
    (torch.float16, 128, 6, 2),    # GQA 3
    (torch.float16, 64, 2, 2),     # GQA 1 (multi-head)
])
def test_mixed_batch_with_shared_prefix(dtype, head_dim, q_heads, kv_heads):
    batch = make_batch(MIXED, block_size=16, q_heads=q_heads, kv_heads=kv_heads,
                       head_dim=head_dim, dtype=dtype, seed=1, shared_blocks=2)
    assert torch.equal(batch.block_tables[0, :2], batch.block_tables[1, :2])
    check(batch, dtype)


@pytest.mark.parametrize("seed", [0, 1])
def test_random_batches(seed):
    rng = random.Random(seed)
    block_size = rng.choice([8, 16])
    seqs = []
    for _ in range(rng.randint(2, 5)):
        cached = rng.choice([0, block_size, rng.randint(1, 3 * block_size)])
        q_len = 1 if rng.random() < 0.5 else rng.randint(2, 2 * block_size)
        seqs.append((cached, q_len))
    dtype = rng.choice([torch.float32, torch.float16])
    q_heads, kv_heads = rng.choice([(4, 4), (6, 2), (8, 2)])
    batch = make_batch(seqs, block_size=block_size, q_heads=q_heads, kv_heads=kv_heads,
                       head_dim=rng.choice([64, 128]), dtype=dtype, seed=seed)
    check(batch, dtype)


@pytest.mark.parametrize("dtype,head_dim,num_splits", [
    (torch.float32, 128, 4),
    (torch.float16, 64, 3),
])
def test_split_kv(dtype, head_dim, num_splits):
    # Long-ish decodes (some splits get no tiles for the short one) and a prefill chunk.
    seqs = [(70, 1), (16, 1), (40, 6)]
    batch = make_batch(seqs, block_size=8, q_heads=8, kv_heads=2, head_dim=head_dim,
                       dtype=dtype, seed=3, shared_blocks=2)
    check(batch, dtype, num_splits=num_splits)


def test_split_kv_chosen_by_wrapper():
    # Two decodes and a block table 128 blocks wide (the engine may pad tables to the
    # model's context): the wrapper picks the split path on its own, without a host sync.
    batch = make_batch([(50, 1), (7, 1)], block_size=16, q_heads=4, kv_heads=1, head_dim=64,
                       dtype=torch.float32, seed=6)
    pad = torch.full((2, 128 - batch.block_tables.shape[1]), 10**6, dtype=torch.int32)
    batch.block_tables = torch.cat([batch.block_tables, pad], dim=1)
    assert _choose_num_splits(programs=(2 // 4 + 2) * 1, max_context=128 * 16, tile_n=16) == 64
    # under the interpreter the wrapper aims at 16 programs: 8 splits here
    assert _choose_num_splits(2, 128 * 16, 16, target=16) == 8
    check(batch, torch.float32)


def test_empty_query_sequence_and_strided_q():
    # A sequence with no new tokens this step, and q as a view of a fused qkv projection.
    batch = make_batch([(9, 1), (12, 0), (3, 4)], block_size=8, q_heads=4, kv_heads=2,
                       head_dim=64, dtype=torch.float32, seed=4)
    T = batch.q.shape[0]
    qkv = torch.randn(T, 4 + 2 * 2, 64)
    qkv[:, :4] = batch.q
    batch.q = qkv[:, :4]
    assert not batch.q.is_contiguous()
    check(batch, torch.float32)


def test_split_choice():
    # 132 SMs (no GPU here): splitting stops at 4 programs per SM, one tile per split, 64
    assert _choose_num_splits(programs=8, max_context=512, tile_n=64) == 8       # a tile each
    assert _choose_num_splits(programs=8, max_context=64, tile_n=64) == 1        # one tile
    assert _choose_num_splits(programs=4096, max_context=32768, tile_n=64) == 1  # busy grid
    assert _choose_num_splits(programs=8, max_context=2048, tile_n=64) == 32     # B=1, 8 KV heads
    assert _choose_num_splits(programs=8, max_context=32768, tile_n=64) == 64    # 1 seq, long
    assert _choose_num_splits(programs=64, max_context=8192, tile_n=64) == 16    # B=8
    assert _choose_num_splits(programs=256 * 8, max_context=2048, tile_n=64) == 1  # B=256


def test_gpu_tile_config(monkeypatch):
    # The configs the wrapper picks on CUDA (64-row tiles for a prefill-heavy batch, 32/64
    # key tiles), run here under the interpreter.
    import inflight.kernels.triton_attention as ta

    monkeypatch.setattr(ta, "is_cuda", lambda t: True)
    assert ta._tile_config(T=40, B=3, group=4, head_dim=64, gpu=True) == (64, 64)
    batch = make_batch([(20, 30), (70, 1), (5, 9)], block_size=16, q_heads=8, kv_heads=2,
                       head_dim=64, dtype=torch.float16, seed=5, shared_blocks=1)
    check(batch, torch.float16)
    # decodes: 16-row tiles of 64 keys, split by the wrapper (a tile per split)
    assert ta._tile_config(T=3, B=3, group=4, head_dim=128, gpu=True) == (16, 64)
    batch = make_batch([(130, 1), (70, 1), (5, 1)], block_size=16, q_heads=8, kv_heads=2,
                       head_dim=128, dtype=torch.float16, seed=7)
    assert ta._choose_num_splits(6, batch.block_tables.shape[1] * 16, 64) == 2  # GPU policy
    check(batch, torch.float16)


@pytest.mark.parametrize("num_splits", [1, 4])
def test_padding_rows_give_zeros(num_splits):
    """A CUDA-graph decode step pads its batch with rows of one query and no context
    (seq_len 0, block table row of zeros): their output is 0 (never NaN), and the real
    rows are untouched."""
    batch = make_batch([(40, 1), (9, 1)], block_size=8, q_heads=4, kv_heads=2, head_dim=64,
                       dtype=torch.float32, seed=8)
    pad = 2
    batch.q = torch.cat([batch.q, torch.randn(pad, 4, 64)])
    batch.block_tables = torch.cat([batch.block_tables,
                                    torch.zeros(pad, batch.block_tables.shape[1], dtype=torch.int32)])
    batch.seq_lens = torch.cat([batch.seq_lens, torch.zeros(pad, dtype=torch.int32)])
    batch.query_start_loc = torch.arange(5, dtype=torch.int32)
    args = [t.to(DEVICE) for t in batch.args()]
    scale = 64 ** -0.5
    ref = paged_attention_ref(*args, scale)
    out = paged_attention_triton(*args, scale, num_splits=num_splits)
    # the torch path gathers whole table rows and blocks (then masks): give it valid pad
    # ids and no NaN rows
    q, k_cache, v_cache, tables, seq_lens, qsl = args
    tables = torch.where(tables >= k_cache.shape[0], 0, tables)
    out_torch = paged_attention_torch(q, k_cache.nan_to_num(), v_cache.nan_to_num(), tables,
                                      seq_lens, qsl, scale)
    for o in (out, out_torch):
        assert not o.isnan().any()
        assert (o[2:] == 0).all()
        torch.testing.assert_close(o.float(), ref.float(), **TOL[torch.float32])


def nan_outside_windows(batch, window):
    """NaN into every cached key and value below the window of each sequence's first new
    token: a path that reads one of them fails the comparison."""
    bs = batch.k_cache.shape[1]
    starts = batch.query_start_loc.tolist()
    for b, seq_len in enumerate(batch.seq_lens.tolist()):
        first_q = seq_len - (starts[b + 1] - starts[b])
        for p in range(max(0, first_q - window + 1)):
            blk, off = int(batch.block_tables[b, p // bs]), p % bs
            batch.k_cache[blk, off] = float("nan")
            batch.v_cache[blk, off] = float("nan")


@pytest.mark.parametrize("window,num_splits,dtype", [
    (8, None, torch.float32),    # shorter than a block: decodes skip whole tiles
    (13, 4, torch.float16),      # split-KV over the window's tiles only
    (1, None, torch.float32),    # each query sees itself only
    (200, None, torch.float32),  # wider than every context: plain causal
])
def test_sliding_window(window, num_splits, dtype):
    # decodes far past the window, a prefill chunk straddling it, a fresh prefill longer
    # than it, a short sequence inside it; no shared blocks (a shared block below one
    # sequence's window may be inside another's)
    seqs = [(70, 1), (33, 9), (0, 21), (3, 2), (47, 1)]
    batch = make_batch(seqs, block_size=8, q_heads=4, kv_heads=2, head_dim=64, dtype=dtype,
                       seed=11)
    nan_outside_windows(batch, window)
    args = [t.to(DEVICE) for t in batch.args()]
    scale = 64 ** -0.5
    ref = paged_attention_ref(*args, scale, sliding_window=window)
    out = paged_attention_triton(*args, scale, num_splits=num_splits, sliding_window=window)
    assert not ref.isnan().any() and not out.isnan().any()
    torch.testing.assert_close(out.float(), ref.float(), **TOL[dtype])
    # the window changes the result wherever a context is longer than it
    if window < 70:
        full = paged_attention_ref(*[t.nan_to_num() for t in args], scale)
        assert not torch.allclose(full[0].float(), ref[0].float(), atol=1e-3)
