"""Triton unified paged attention: the kernel behind `attention.paged_attention_ref`.

One launch serves the engine's whole mixed batch (decodes and prefill chunks after a cached
prefix); the layout is the one documented in kernels/attention.py.

Work split. A program owns one *query block* of one sequence and one KV head: BLOCK_Q
consecutive query tokens times the GROUP query heads that read that KV head, packed as the
BLOCK_M rows of one tile, so K and V are loaded once per KV head and shared by the group:

    row r of the tile:   token  = q_block_start + r // GROUP
                         q head = kv_head * GROUP + r % GROUP       (rows >= BLOCK_Q * GROUP idle)

Query blocks are numbered across the batch without a host sync: sequence b's blocks start
at `query_start_loc[b] // BLOCK_Q + b`, so `T // BLOCK_Q + B` programs always suffice, and a
program finds its sequence by binary search over query_start_loc (surplus programs exit).

    grid = (T // BLOCK_Q + B, Hkv, NUM_SPLITS)

The program walks its context in tiles of TILE_N keys, each key's cache row found through
the block table (so TILE_N and the cache block size are independent), with an online
softmax in fp32 (flash-attention): memory stays linear in the context length.

Sliding window (SLIDING, `window` W): query at position p sees keys p - W + 1 .. p. The
program starts at the tile holding its first query's lowest visible key and masks the
loads below it, so no key outside every query's window is read (its block may be stale):

    keys:  [ never read ...... | kv_start ...... tiles walked ...... | kv_end ]
                                 = first q_pos - W + 1                 = last q_pos + 1

8-bit cache (QUANT: int8 or fp8 values, one fp16 scale per token and KV head, layout in
kernels/kv_quant.py): a tile's raw values are cast to the query dtype (exact: int8 and e4m3
values are representable in fp16, bf16 and fp32), the key scales multiply the tile's scores
column-wise after the dot (TILE_N multiplies, not D x TILE_N), and V is dequantized as it is
loaded (its scales weigh rows of V, which p cannot carry without losing fp16 precision).

Split-KV (flash-decoding): with few programs and long contexts the GPU would idle, so the
wrapper may cut each context into NUM_SPLITS ranges of tiles; each split writes its
unnormalised accumulator with its running max and sum, and a second kernel merges them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from inflight.kernels.kv_quant import SCALE_DTYPE, is_quantized
from inflight.kernels.triton_util import check_device, is_cuda, num_sms

LOG2E = 1.4426950408889634


@triton.jit
def _find_seq(query_start_loc_ptr, q_block, num_seqs, BLOCK_Q: tl.constexpr):
    """The last sequence b whose first query block (query_start_loc[b] // BLOCK_Q + b) <= q_block."""
    # Tensors from the start: a loop-carried int must keep one type when compiled (and
    # num_seqs == 1 would be specialised to a constant).
    lo = tl.full([], 0, tl.int32)
    hi = tl.full([], 0, tl.int32) + num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first <= q_block:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _paged_attention_kernel(
    out_ptr, m_ptr, l_ptr,
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, query_start_loc_ptr,
    k_scale_ptr, v_scale_ptr,             # [num_blocks, block_size, Hkv] fp16 (QUANT only)
    scale_log2, num_seqs, window,
    stride_qt, stride_qh,
    stride_ot, stride_oh, stride_os,      # out: [T, Hq, D], or [T, Hq, S, D] fp32 partials
    stride_mt, stride_mh,                 # m, l: [T, Hq, S] (split path only)
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_bt, stride_sb, stride_ss,
    BLOCK_SIZE: tl.constexpr,             # rows per cache block
    GROUP: tl.constexpr,                  # query heads per KV head
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr, TILE_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SLIDING: tl.constexpr,                # a per-layer window of `window` keys
    DOT_PRECISION: tl.constexpr,
    QUANT: tl.constexpr,                  # an 8-bit cache with per-token scales
):
    q_block = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    b = _find_seq(query_start_loc_ptr, q_block, num_seqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + b)
    q_len = tl.load(query_start_loc_ptr + b + 1) - q_start
    local_block = q_block - (q_start // BLOCK_Q + b)
    if local_block * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + b)
    cached = seq_len - q_len              # new tokens sit at positions cached .. seq_len - 1

    rows = tl.arange(0, BLOCK_M)
    q_idx = local_block * BLOCK_Q + rows // GROUP          # token index within the sequence
    head = kv_head * GROUP + rows % GROUP
    row_ok = (rows < BLOCK_Q * GROUP) & (q_idx < q_len)
    q_pos = cached + q_idx
    d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = d < HEAD_DIM

    q_rows = (q_start + q_idx).to(tl.int64)
    q = tl.load(q_ptr + q_rows[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)

    # Keys up to the last valid row's position; causality masks the rest inside tiles.
    kv_end = tl.minimum(seq_len, cached + tl.minimum((local_block + 1) * BLOCK_Q, q_len))
    if SLIDING:
        kv_start = tl.maximum(cached + local_block * BLOCK_Q - window + 1, 0)
    else:
        kv_start = 0
    first_tile = kv_start // TILE_N
    num_tiles = tl.cdiv(kv_end, TILE_N) - first_tile
    if NUM_SPLITS == 1:
        tile_lo = first_tile
        tile_hi = first_tile + num_tiles
    else:
        per_split = tl.cdiv(num_tiles, NUM_SPLITS)
        tile_lo = first_tile + split * per_split
        tile_hi = tl.minimum(tile_lo + per_split, first_tile + num_tiles)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    block_row = block_tables_ptr + b.to(tl.int64) * stride_bt

    for tile in range(tile_lo, tile_hi):
        k_pos = tile * TILE_N + tl.arange(0, TILE_N)
        k_ok = (k_pos < kv_end) & (k_pos >= kv_start)
        block = tl.load(block_row + k_pos // BLOCK_SIZE, mask=k_ok, other=0).to(tl.int64)
        offset = k_pos % BLOCK_SIZE
        k = tl.load(k_cache_ptr + block[None, :] * stride_kb + offset[None, :] * stride_ks
                    + kv_head * stride_kh + d[:, None],
                    mask=k_ok[None, :] & d_ok[:, None], other=0.0)           # [D, TILE_N]
        v = tl.load(v_cache_ptr + block[:, None] * stride_vb + offset[:, None] * stride_vs
                    + kv_head * stride_vh + d[None, :],
                    mask=k_ok[:, None] & d_ok[None, :], other=0.0)           # [TILE_N, D]

        if QUANT:
            s_off = block * stride_sb + offset * stride_ss + kv_head
            k_scale = tl.load(k_scale_ptr + s_off, mask=k_ok, other=0.0).to(tl.float32)
            v_scale = tl.load(v_scale_ptr + s_off, mask=k_ok, other=0.0).to(tl.float32)
            v = (v.to(tl.float32) * v_scale[:, None]).to(q.dtype)
            s = tl.dot(q, k.to(q.dtype), input_precision=DOT_PRECISION) * (k_scale * scale_log2)[None, :]
        else:
            s = tl.dot(q, k, input_precision=DOT_PRECISION) * scale_log2   # log2 domain
        visible = (k_pos[None, :] <= q_pos[:, None]) & k_ok[None, :]
        if SLIDING:
            visible = visible & (k_pos[None, :] > q_pos[:, None] - window)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        # NOTE: a row with no visible key yet keeps max -inf; shift by 0 so that
        # exp2(-inf - -inf) never makes a NaN (its p and alpha are then 0).
        m_new = tl.where(m_new > float("-inf"), m_new, 0.0)
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    if NUM_SPLITS == 1:
        l_safe = tl.where(l_i > 0.0, l_i, 1.0)
        out = acc / l_safe[:, None]
        tl.store(out_ptr + q_rows[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    else:
        # Partials, written even for an empty split (m = -inf, l = 0, acc = 0) so the merge
        # never reads uninitialised memory.
        tl.store(out_ptr + q_rows[:, None] * stride_ot + head[:, None] * stride_oh
                 + split * stride_os + d[None, :], acc, mask=row_ok[:, None] & d_ok[None, :])
        ml = q_rows * stride_mt + head * stride_mh + split
        # A row that saw no key here has m = 0 (see above) and l = 0: store -inf so that the
        # merge gives it weight 0 rather than 2^(0 - M), which can overflow.
        tl.store(m_ptr + ml, tl.where(l_i > 0.0, m_i, float("-inf")), mask=row_ok)
        tl.store(l_ptr + ml, l_i, mask=row_ok)


@triton.jit
def _merge_splits_kernel(
    out_ptr, acc_ptr, m_ptr, l_ptr,
    stride_ot, stride_oh, stride_at, stride_ah, stride_as, stride_mt, stride_mh,
    NUM_SPLITS: tl.constexpr, SPLITS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
):
    """out[t, h] = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s, M = max_s m_s."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    s = tl.arange(0, SPLITS_PAD)
    s_ok = s < NUM_SPLITS
    d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = d < HEAD_DIM
    m = tl.load(m_ptr + t * stride_mt + h * stride_mh + s, mask=s_ok, other=float("-inf"))
    l = tl.load(l_ptr + t * stride_mt + h * stride_mh + s, mask=s_ok, other=0.0)
    m_max = tl.max(m, axis=0)
    # NOTE: -inf only for a row with no context at all (a padding row of a CUDA-graph
    # decode step): shift by 0 and divide by 1, so its output is 0, not NaN.
    m_max = tl.where(m_max > float("-inf"), m_max, 0.0)
    w = tl.math.exp2(m - m_max)
    acc = tl.load(acc_ptr + t * stride_at + h * stride_ah + s[:, None] * stride_as + d[None, :],
                  mask=s_ok[:, None] & d_ok[None, :], other=0.0)
    denom = tl.sum(l * w, axis=0)
    out = tl.sum(acc * w[:, None], axis=0) / tl.where(denom > 0.0, denom, 1.0)
    tl.store(out_ptr + t * stride_ot + h * stride_oh + d, out.to(out_ptr.dtype.element_ty), mask=d_ok)


def _tile_config(T: int, B: int, group: int, head_dim: int, gpu: bool) -> tuple[int, int]:
    """(BLOCK_M, TILE_N). A tile's rows are BLOCK_Q tokens x GROUP heads: decode-heavy
    batches take 16 rows (one token per sequence would waste most of a bigger tile),
    prefill-heavy ones (T >= 4 B tokens, no host sync) 64. Decode tiles read 64 keys
    (head dim <= 128): a decode program is a stream of K/V loads, and longer tiles keep
    more bytes in flight per program. Under the interpreter, 16-key tiles keep the tests'
    short contexts multi-tile."""
    prefill_heavy = T >= 4 * B
    block_m = max(64 if prefill_heavy and gpu else 16, triton.next_power_of_2(group))
    if not gpu:
        return block_m, 16
    if prefill_heavy:
        return block_m, 64 if head_dim <= 64 else 32
    return block_m, 64 if head_dim <= 128 else 32


MAX_SPLITS = 64
PROGRAMS_PER_SM = 4
INTERPRETER_PROGRAMS = 16  # CPU (TRITON_INTERPRET): programs run one by one; split a little


def _choose_num_splits(programs: int, max_context: int, tile_n: int,
                       target: int | None = None) -> int:
    """Split each context into NUM_SPLITS ranges of tiles when the plain grid would leave
    the GPU short of programs: a small-batch decode is a pure stream of K/V reads, and a
    few programs per KV head cannot keep enough loads in flight (at most 8 splits left a
    batch-1 decode far from HBM bandwidth). Double the splits while the grid is under
    PROGRAMS_PER_SM programs per SM and every split still has a tile of its own; a power
    of two (bounded compiles), <= MAX_SPLITS. No host sync: `max_context` comes from the
    block table's width, so an engine whose tables are as wide as the model's context
    splits for the worst case (empty splits exit after writing an empty partial).
    `target`: programs wanted (default PROGRAMS_PER_SM per SM of the GPU)."""
    if target is None:
        target = PROGRAMS_PER_SM * num_sms()
    tiles = -(-max_context // tile_n)
    splits = 1
    while splits < MAX_SPLITS and programs * splits < target and tiles >= 2 * splits:
        splits *= 2
    return splits


def paged_attention_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor,
                           query_start_loc: torch.Tensor, scale: float,
                           num_splits: int | None = None, *,
                           sliding_window: int | None = None, k_scale: torch.Tensor | None = None,
                           v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as `paged_attention_ref`. `num_splits` forces the split-KV path
    (None: chosen from the grid size and block_tables' width, with no host sync).
    `sliding_window`: each query sees only its last `sliding_window` keys (None: all).
    `k_scale`/`v_scale`: an 8-bit cache's scales (kernels/kv_quant.py)."""
    T, Hq, D = q.shape
    num_blocks, block_size, Hkv, Dk = k_cache.shape
    B = seq_lens.shape[0]
    assert Dk == D and v_cache.shape == k_cache.shape, (q.shape, k_cache.shape, v_cache.shape)
    assert Hq % Hkv == 0, f"query heads {Hq} not a multiple of KV heads {Hkv}"
    quant = is_quantized(k_cache.dtype)
    if quant:
        assert k_cache.dtype == v_cache.dtype and k_scale is not None and v_scale is not None
        assert k_scale.shape == v_scale.shape == k_cache.shape[:3], (k_scale.shape, k_cache.shape)
        assert k_scale.dtype == v_scale.dtype == SCALE_DTYPE and k_scale.is_contiguous() and v_scale.is_contiguous()
        check_device(q, k_scale, v_scale)
    else:
        assert q.dtype == k_cache.dtype == v_cache.dtype, (q.dtype, k_cache.dtype, v_cache.dtype)
        k_scale = v_scale = seq_lens  # unused
    assert q.stride(2) == 1 and k_cache.stride(3) == 1 and v_cache.stride(3) == 1, "head dim must be contiguous"
    assert block_tables.dim() == 2 and block_tables.shape[0] == B and block_tables.stride(1) == 1
    assert query_start_loc.shape == (B + 1,) and query_start_loc.is_contiguous() and seq_lens.is_contiguous()
    assert block_tables.dtype == seq_lens.dtype == query_start_loc.dtype == torch.int32
    assert sliding_window is None or sliding_window >= 1, sliding_window
    check_device(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc)

    out = torch.empty((T, Hq, D), dtype=q.dtype, device=q.device)
    if T == 0:
        return out
    group = Hq // Hkv
    head_dim_pad = max(16, triton.next_power_of_2(D))
    block_m, tile_n = _tile_config(T, B, group, D, gpu=is_cuda(q))
    block_q = block_m // group
    programs = (T // block_q + B) * Hkv
    if num_splits is None:
        context = block_tables.shape[1] * block_size
        if sliding_window is not None:  # a window bounds the keys a program walks
            context = min(context, sliding_window + block_m // group + tile_n)
        num_splits = _choose_num_splits(programs, context, tile_n,
                                        None if is_cuda(q) else INTERPRETER_PROGRAMS)
    assert num_splits >= 1

    dot_precision = "ieee" if q.dtype == torch.float32 else None
    grid = (T // block_q + B, Hkv, num_splits)
    common = dict(BLOCK_SIZE=block_size, GROUP=group, HEAD_DIM=D, HEAD_DIM_PAD=head_dim_pad,
                  BLOCK_Q=block_q, BLOCK_M=block_m, TILE_N=tile_n, NUM_SPLITS=num_splits,
                  SLIDING=sliding_window is not None, DOT_PRECISION=dot_precision, QUANT=quant,
                  num_warps=4, num_stages=2)
    args = (q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, k_scale, v_scale,
            scale * LOG2E, B, sliding_window or 0, q.stride(0), q.stride(1))
    cache_strides = (k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                     v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_tables.stride(0),
                     block_size * Hkv, Hkv)
    if num_splits == 1:
        _paged_attention_kernel[grid](out, out, out, *args, out.stride(0), out.stride(1), 0, 0, 0,
                                      *cache_strides, **common)
        return out

    acc = torch.empty((T, Hq, num_splits, D), dtype=torch.float32, device=q.device)
    m = torch.empty((T, Hq, num_splits), dtype=torch.float32, device=q.device)
    l = torch.empty_like(m)
    _paged_attention_kernel[grid](acc, m, l, *args, acc.stride(0), acc.stride(1), acc.stride(2),
                                  m.stride(0), m.stride(1), *cache_strides, **common)
    _merge_splits_kernel[(T, Hq)](out, acc, m, l, out.stride(0), out.stride(1),
                                  acc.stride(0), acc.stride(1), acc.stride(2), m.stride(0), m.stride(1),
                                  NUM_SPLITS=num_splits, SPLITS_PAD=triton.next_power_of_2(num_splits),
                                  HEAD_DIM=D, HEAD_DIM_PAD=head_dim_pad, num_warps=4)
    return out

