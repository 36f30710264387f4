"""Paged attention over a flattened, mixed batch (prefill chunks and decodes together).

Layout of one batch of B sequences, T scheduled tokens in all:

    q               [T, Hq, D]      the new tokens' queries, sequences concatenated
    query_start_loc [B + 1] int32   sequence b owns q[query_start_loc[b] : query_start_loc[b+1]]
    seq_lens        [B] int32       context length of b *including* its new tokens
    block_tables    [B, M] int32    block ids of b's context, in order (pad entries unused)
    k_cache/v_cache [num_blocks, block_size, Hkv, D]

Sequence b has q_len = query_start_loc[b+1] - query_start_loc[b] new tokens; they sit at
positions seq_len - q_len ... seq_len - 1 (everything before is cached context, either
computed earlier or shared through the prefix cache). Query i of b attends causally to
keys 0 .. seq_len - q_len + i. Token at position p lives in block block_tables[b, p // bs],
row p % bs. Grouped-query attention: query head h reads KV head h // (Hq // Hkv).

    context of b:  [ cached ............ | new (q_len) ]
                    0                    ^ seq_len - q_len        ^ seq_len

An 8-bit cache (int8 or fp8, `kv_cache_dtype`) comes with k_scale/v_scale [num_blocks,
block_size, Hkv] fp16, one scale per token per KV head (kernels/kv_quant.py): every path
reads key = k_cache[...] * k_scale[...] in fp32.

A sequence with one query and seq_len 0 is padding (CUDA-graph decode steps run padded
batches): its output is zeros, and it reads no cache.

Sliding window W (`sliding_window`, per layer; None = none): query at position p sees
only keys p - W + 1 .. p (as transformers' sliding-window mask, `kv > q - W`). No path
reads a block that holds no key of some query's window (the reference and the Triton
kernel read no such key at all), so blocks below every window may hold stale data:

    context of b:  [ never read | window of the first new token ... | new (q_len) ]
                                 ^ seq_len - q_len - W + 1
"""

from __future__ import annotations

import torch

from inflight.kernels.kv_quant import dequantize_kv


def _read(cache: torch.Tensor, scales: torch.Tensor | None, *index) -> torch.Tensor:
    """cache[index] in fp32, dequantized when the cache is 8-bit."""
    return cache[index].float() if scales is None else dequantize_kv(cache[index], scales[index])


def paged_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        block_tables: torch.Tensor, seq_lens: torch.Tensor,
                        query_start_loc: torch.Tensor, scale: float, *,
                        sliding_window: int | None = None, k_scale: torch.Tensor | None = None,
                        v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Plain-torch reference: one sequence at a time, fp32 math, returns q's dtype."""
    T, Hq, D = q.shape
    _, bs, Hkv, _ = k_cache.shape
    group = Hq // Hkv
    out = torch.empty_like(q)
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    for b, seq_len in enumerate(lens):
        s, e = starts[b], starts[b + 1]
        q_len = e - s
        if q_len == 0:
            continue
        lo = 0 if sliding_window is None else max(0, seq_len - q_len - sliding_window + 1)
        positions = torch.arange(lo, seq_len, device=q.device)
        blocks = block_tables[b, positions // bs].long()
        k = _read(k_cache, k_scale, blocks, positions % bs)  # [L, Hkv, D]: keys lo .. seq_len - 1
        v = _read(v_cache, v_scale, blocks, positions % bs)
        k = k.repeat_interleave(group, dim=1)  # [L, Hq, D]
        v = v.repeat_interleave(group, dim=1)
        qb = q[s:e].float()  # [q_len, Hq, D]
        scores = torch.einsum("qhd,khd->hqk", qb, k) * scale
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)[:, None]
        k_pos = positions[None, :]
        hidden = k_pos > q_pos
        if sliding_window is not None:
            hidden |= k_pos <= q_pos - sliding_window
        scores.masked_fill_(hidden[None], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[s:e] = torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)
    return out


def paged_attention_torch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          block_tables: torch.Tensor, seq_lens: torch.Tensor,
                          query_start_loc: torch.Tensor, scale: float, *,
                          sliding_window: int | None = None, k_scale: torch.Tensor | None = None,
                          v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Faster torch path, equal to `paged_attention_ref` (tested): the single-token (decode)
    sequences go through one batched, padded block gather and one masked
    `scaled_dot_product_attention`; each multi-token (prefill chunk) sequence through its
    own causal one. Grouped-query heads are read in place (enable_gqa). fp32 math. With a
    window, decodes gather only the blocks that hold a visible key (masking the rest of
    the first one), prefill chunks only the visible keys."""
    import torch.nn.functional as F

    T, Hq, D = q.shape
    nb, bs, Hkv, _ = k_cache.shape
    W = sliding_window
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    out = torch.empty_like(q)
    k_flat, v_flat = k_cache.view(nb, bs * Hkv * D), v_cache.view(nb, bs * Hkv * D)
    ks_flat = None if k_scale is None else k_scale.view(nb, bs * Hkv)
    vs_flat = None if v_scale is None else v_scale.view(nb, bs * Hkv)

    def blocks(flat, scales, idx):  # whole blocks idx -> fp32 [len(idx) * bs, Hkv, D]
        x = flat.index_select(0, idx).view(-1, Hkv, D)
        return x.float() if scales is None else dequantize_kv(x, scales.index_select(0, idx).view(-1, Hkv))
    decodes = [b for b in range(len(lens)) if starts[b + 1] - starts[b] == 1]
    if decodes:
        all_decode = len(decodes) == len(lens)  # then rows of q are sequences 0..B-1
        n_blocks = (max(lens[b] for b in decodes) + bs - 1) // bs
        if all_decode:
            bt, lens_t, qd = block_tables[:, :n_blocks], seq_lens, q
        else:
            sel = torch.tensor(decodes, device=q.device)
            rows = torch.tensor([starts[b] for b in decodes], device=q.device)
            bt, lens_t, qd = block_tables[sel, :n_blocks], seq_lens[sel], q[rows]
        Bd = len(decodes)
        if W is None:
            first = None  # every block from the first
        else:  # [Bd, nw] columns from the block of each sequence's first visible key
            nw = min(n_blocks, (W - 1) // bs + 2)
            first = (lens_t.long() - W).clamp(min=0) // bs
            cols = (first[:, None] + torch.arange(nw, device=q.device)[None, :]).clamp(max=n_blocks - 1)
            bt = bt.gather(1, cols.to(bt.device)) if n_blocks else bt
            n_blocks = nw
        L = n_blocks * bs
        # [Bd * n_blocks] whole blocks -> [Bd, L, Hkv, D] -> a [Bd, Hkv, L, D] view
        idx = bt.reshape(-1).long()
        k = blocks(k_flat, ks_flat, idx).view(Bd, L, Hkv, D).transpose(1, 2)
        v = blocks(v_flat, vs_flat, idx).view(Bd, L, Hkv, D).transpose(1, 2)
        k_pos = torch.arange(L, device=q.device)[None, :]
        if first is not None:
            k_pos = k_pos + first[:, None] * bs
        keep = k_pos < lens_t[:, None]
        if W is not None:
            keep &= k_pos >= lens_t[:, None] - W
        o = F.scaled_dot_product_attention(qd.float().view(Bd, Hq, 1, D), k, v,
                                           attn_mask=keep[:, None, None, :], scale=scale,
                                           enable_gqa=True).view(Bd, Hq, D).to(q.dtype)
        if 0 in lens:  # padding rows (no context, so decodes): 0, as the kernel
            o = o.masked_fill((lens_t == 0)[:, None, None], 0.0)
        if all_decode:
            return o
        out[rows] = o
    for b, seq_len in enumerate(lens):
        s, e = starts[b], starts[b + 1]
        q_len = e - s
        if q_len <= 1:
            continue
        lo = 0 if W is None else max(0, seq_len - q_len - W + 1)  # the first visible key
        first = lo // bs
        n_blocks = (seq_len + bs - 1) // bs - first
        idx = block_tables[b, first:first + n_blocks].long()
        span = slice(lo - first * bs, seq_len - first * bs)
        k = blocks(k_flat, ks_flat, idx)[span].transpose(0, 1)
        v = blocks(v_flat, vs_flat, idx)[span].transpose(0, 1)
        # NOTE: 4-D (batch of one): 3-D inputs with a mask take torch's slow "math" path
        qb = q[s:e].float().transpose(0, 1)[None]  # [1, Hq, q_len, D]
        k, v = k[None], v[None]
        if q_len == seq_len and (W is None or W >= seq_len):  # plain causal
            o = F.scaled_dot_product_attention(qb, k, v, is_causal=True, scale=scale, enable_gqa=True)
        else:
            q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)[:, None]
            k_pos = torch.arange(lo, seq_len, device=q.device)[None, :]
            mask = k_pos <= q_pos
            if W is not None:
                mask &= k_pos > q_pos - W
            o = F.scaled_dot_product_attention(qb, k, v, attn_mask=mask[None, None], scale=scale,
                                               enable_gqa=True)
        out[s:e] = o[0].transpose(0, 1).to(q.dtype)
    return out
