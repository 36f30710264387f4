"""Paged attention on the CPU, planned once per forward and run per layer.

The layouts are those of kernels/attention.py (q [T, Hq, D], k_cache/v_cache [num_blocks,
block_size, Hkv, D], an 8-bit cache with its per-token scales), and so is the math:
`paged_attention_torch`, to which `paged_attention_planned(q, ..., plan_attention(...))`
is equal (tests/kernels/test_cpu_attention.py). What moves out of the layer loop is
everything that depends on the step and not on the layer: the host copies of the
sequence lengths and query starts, which sequences decode, the block ids each one reads,
the key masks. `paged_attention_torch` recomputed them in every layer (two host syncs
and a few dozen small ops per layer).

Reading the cache: a sequence whose blocks are consecutive in the cache (a lone sequence
usually is: the block pool hands out fresh blocks in order) is read through a view of
those blocks, without a copy; the others' blocks are gathered (one `index_select` per
layer for K and one for V, decodes batched together).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from inflight.kernels.kv_quant import dequantize_kv


@dataclass(frozen=True)
class Span:
    """Where one sequence's visible keys are: blocks `first .. first + n - 1` of its block
    table row, as cache block ids `idx` (or the range start `start` when consecutive), and
    the token rows `lo .. hi - 1` of those blocks that its queries may see."""

    idx: torch.Tensor | None     # [n] int64 block ids; None when `start` is set
    start: int                   # first block id of a consecutive run (when idx is None)
    n: int
    lo: int
    hi: int


@dataclass(frozen=True)
class PrefillSeq:
    """One multi-token sequence of the step: its query rows and what they attend to."""

    s: int
    e: int
    span: Span
    mask: torch.Tensor | None    # [1, 1, q_len, keys] bool, None: plain causal (or none)
    causal: bool


@dataclass(frozen=True)
class DecodeBatch:
    """The step's single-query sequences, attended to in one padded, masked call."""

    rows: torch.Tensor | None    # [Bd] their rows of q; None: every row (an all-decode step)
    idx: torch.Tensor | None     # [Bd * nb] block ids gathered, nb per sequence
    span: Span | None            # a lone decode over consecutive blocks: read as a view
    mask: torch.Tensor | None    # [Bd, 1, 1, nb * bs] bool
    pad: torch.Tensor | None     # [Bd, 1, 1] rows with no context (padding): zero output
    n: int                       # Bd
    nb: int


@dataclass(frozen=True)
class AttentionPlan:
    decodes: DecodeBatch | None
    prefills: tuple[PrefillSeq, ...]
    num_tokens: int
    # the step's own inputs, for kernels that read the cache through the block table
    # themselves (kernels/cpu_ops.py: the native decode attention)
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    window: int | None

    @property
    def all_decode(self) -> bool:
        return self.decodes is not None and not self.prefills


def _span(row: list[int], first: int, n: int, lo: int, hi: int) -> Span:
    ids = row[first:first + n]
    if ids and ids[-1] - ids[0] == n - 1 and ids == list(range(ids[0], ids[0] + n)):
        return Span(None, ids[0], n, lo, hi)
    return Span(torch.tensor(ids, dtype=torch.int64), 0, n, lo, hi)


def plan_attention(block_tables: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
                   block_size: int, sliding_window: int | None = None) -> AttentionPlan:
    """What every layer's attention of this step reads (layouts in kernels/attention.py)."""
    bs, W = block_size, sliding_window
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    B = len(lens)
    decodes = [b for b in range(B) if starts[b + 1] - starts[b] == 1]
    multi = [b for b in range(B) if starts[b + 1] - starts[b] > 1]
    tables = block_tables.tolist() if decodes and len(decodes) == 1 or multi else None
    prefills = []
    for b in multi:
        s, e, seq_len = starts[b], starts[b + 1], lens[b]
        q_len = e - s
        lo = 0 if W is None else max(0, seq_len - q_len - W + 1)  # the first visible key
        first = lo // bs
        n = (seq_len + bs - 1) // bs - first
        span = _span(tables[b], first, n, lo - first * bs, seq_len - first * bs)
        causal = q_len == seq_len and (W is None or W >= seq_len)
        mask = None
        if not causal:
            q_pos = torch.arange(seq_len - q_len, seq_len)[:, None]
            k_pos = torch.arange(lo, seq_len)[None, :]
            mask = k_pos <= q_pos
            if W is not None:
                mask &= k_pos > q_pos - W
            mask = mask[None, None]
        prefills.append(PrefillSeq(s, e, span, mask, causal))
    batch = _plan_decodes(block_tables, seq_lens, lens, starts, decodes, tables, bs, W) if decodes else None
    return AttentionPlan(batch, tuple(prefills), starts[-1], block_tables, seq_lens, W)


def _plan_decodes(block_tables, seq_lens, lens, starts, decodes, tables, bs, W) -> DecodeBatch:
    Bd = len(decodes)
    all_decode = Bd == len(lens)
    if Bd == 1 and lens[decodes[0]] > 0:  # a lone decode: only its visible keys, no mask
        b = decodes[0]
        seq_len = lens[b]
        lo = 0 if W is None else max(0, seq_len - W)
        first = lo // bs
        n = (seq_len + bs - 1) // bs - first
        span = _span(tables[b], first, n, lo - first * bs, seq_len - first * bs)
        rows = None if all_decode else torch.tensor([starts[b]])
        return DecodeBatch(rows, None, span, None, None, 1, n)
    n_blocks = (max(lens[b] for b in decodes) + bs - 1) // bs
    if all_decode:
        bt, lens_t, rows = block_tables[:, :n_blocks], seq_lens, None
    else:
        sel = torch.tensor(decodes)
        rows = torch.tensor([starts[b] for b in decodes])
        bt, lens_t = block_tables[sel, :n_blocks], seq_lens[sel]
    first = None
    if W is not None:  # [Bd, nw] columns from the block of each sequence's first visible key
        nw = min(n_blocks, (W - 1) // bs + 2)
        first = (lens_t.long() - W).clamp(min=0) // bs
        cols = (first[:, None] + torch.arange(nw)[None, :]).clamp(max=n_blocks - 1)
        bt = bt.gather(1, cols) if n_blocks else bt
        n_blocks = nw
    k_pos = torch.arange(n_blocks * bs)[None, :]
    if first is not None:
        k_pos = k_pos + first[:, None] * bs
    keep = k_pos < lens_t[:, None]
    if W is not None:
        keep &= k_pos >= lens_t[:, None] - W
    pad = (lens_t == 0)[:, None, None] if 0 in lens else None
    return DecodeBatch(rows, bt.reshape(-1).long(), None, keep[:, None, None, :], pad, Bd, n_blocks)


def _read(cache: torch.Tensor, scales: torch.Tensor | None, span: Span) -> torch.Tensor:
    """The span's token rows lo .. hi - 1 as fp32 [hi - lo, Hkv, D] (a view when possible)."""
    nb, bs, hkv, d = cache.shape
    if span.idx is None:
        x = cache.narrow(0, span.start, span.n).view(span.n * bs, hkv, d)[span.lo:span.hi]
        s = None if scales is None else scales.narrow(0, span.start, span.n).view(-1, hkv)[span.lo:span.hi]
    else:
        x = cache.index_select(0, span.idx).view(span.n * bs, hkv, d)[span.lo:span.hi]
        s = None if scales is None else scales.index_select(0, span.idx).view(-1, hkv)[span.lo:span.hi]
    return x.float() if s is None else dequantize_kv(x, s)


def _gather(cache: torch.Tensor, scales: torch.Tensor | None, idx: torch.Tensor, bd: int,
            n_blocks: int) -> torch.Tensor:
    """Whole blocks idx -> fp32 [Bd, Hkv, nb * bs, D] (a transposed view of the copy)."""
    nb, bs, hkv, d = cache.shape
    x = cache.index_select(0, idx).view(bd, n_blocks * bs, hkv, d)
    if scales is not None:
        x = dequantize_kv(x, scales.index_select(0, idx).view(bd, n_blocks * bs, hkv))
    return x.float().transpose(1, 2)


def paged_attention_planned(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            plan: AttentionPlan, scale: float, k_scale: torch.Tensor | None = None,
                            v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """`paged_attention_torch` with the step's plan (`plan_attention`) made beforehand."""
    T, Hq, D = q.shape
    d = plan.decodes
    if d is not None and d.rows is None:  # an all-decode step: its output is the decodes'
        return _decode(q, k_cache, v_cache, d, scale, k_scale, v_scale)
    out = torch.empty_like(q)
    if d is not None:
        out[d.rows] = _decode(q[d.rows], k_cache, v_cache, d, scale, k_scale, v_scale)
    for p in plan.prefills:
        k = _read(k_cache, k_scale, p.span).transpose(0, 1)[None]
        v = _read(v_cache, v_scale, p.span).transpose(0, 1)[None]
        # NOTE: 4-D (batch of one): 3-D inputs with a mask take torch's slow "math" path
        qb = q[p.s:p.e].float().transpose(0, 1)[None]  # [1, Hq, q_len, D]
        o = F.scaled_dot_product_attention(qb, k, v, attn_mask=p.mask, is_causal=p.causal,
                                           scale=scale, enable_gqa=True)
        out[p.s:p.e] = o[0].transpose(0, 1).to(q.dtype)
    return out


def _decode(qd: torch.Tensor, k_cache, v_cache, d: DecodeBatch, scale: float, k_scale, v_scale):
    Bd, Hq, D = qd.shape
    if d.span is not None:  # one sequence, its visible keys only: no mask
        k = _read(k_cache, k_scale, d.span).transpose(0, 1)[None]
        v = _read(v_cache, v_scale, d.span).transpose(0, 1)[None]
        mask = None
    else:
        k = _gather(k_cache, k_scale, d.idx, Bd, d.nb)
        v = _gather(v_cache, v_scale, d.idx, Bd, d.nb)
        mask = d.mask
    o = F.scaled_dot_product_attention(qd.float().view(Bd, Hq, 1, D), k, v, attn_mask=mask,
                                       scale=scale, enable_gqa=True).view(Bd, Hq, D).to(qd.dtype)
    if d.pad is not None:  # padding rows (no context): 0, as the kernel
        o = o.masked_fill(d.pad, 0.0)
    return o
