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
"""

from __future__ import annotations

import torch


def paged_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        block_tables: torch.Tensor, seq_lens: torch.Tensor,
                        query_start_loc: torch.Tensor, scale: float) -> torch.Tensor:
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
        n_blocks = (seq_len + bs - 1) // bs
        blocks = block_tables[b, :n_blocks].long()
        k = k_cache[blocks].reshape(n_blocks * bs, Hkv, D)[:seq_len].float()
        v = v_cache[blocks].reshape(n_blocks * bs, Hkv, D)[:seq_len].float()
        k = k.repeat_interleave(group, dim=1)  # [L, Hq, D]
        v = v.repeat_interleave(group, dim=1)
        qb = q[s:e].float()  # [q_len, Hq, D]
        scores = torch.einsum("qhd,khd->hqk", qb, k) * scale
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)[:, None]
        k_pos = torch.arange(seq_len, device=q.device)[None, :]
        scores.masked_fill_((k_pos > q_pos)[None], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[s:e] = torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)
    return out


def paged_attention_torch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          block_tables: torch.Tensor, seq_lens: torch.Tensor,
                          query_start_loc: torch.Tensor, scale: float) -> torch.Tensor:
    """Faster torch path, equal to `paged_attention_ref` (tested): the single-token (decode)
    sequences go through one batched, padded gather + masked attention; each multi-token
    (prefill chunk) sequence goes through `scaled_dot_product_attention`. fp32 math."""
    import torch.nn.functional as F

    T, Hq, D = q.shape
    _, bs, Hkv, _ = k_cache.shape
    group = Hq // Hkv
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    out = torch.empty_like(q)
    decodes = [b for b in range(len(lens)) if starts[b + 1] - starts[b] == 1]
    if decodes:
        rows = [starts[b] for b in decodes]
        max_len = max(lens[b] for b in decodes)
        n_blocks = (max_len + bs - 1) // bs
        if len(decodes) == len(lens):  # all decodes: rows are 0..B-1, no selection needed
            bt, lens_t, qd = block_tables[:, :n_blocks], seq_lens, q
        else:
            sel = torch.tensor(decodes, device=q.device)
            bt, lens_t = block_tables[sel, :n_blocks], seq_lens[sel]
            qd = q[torch.tensor(rows, device=q.device)]
        Bd = len(decodes)
        L = n_blocks * bs
        # NOTE: gather head-major rows [Bd, Hkv, L, D] so both matmuls run on contiguous
        # matrices; row r of the cache viewed as [num_blocks * bs * Hkv, D] is
        # (slot * Hkv + head), slot = block * bs + offset.
        pos = torch.arange(L, device=q.device)
        slots = bt.long().repeat_interleave(bs, dim=1) * bs + (pos % bs)[None, :]  # [Bd, L]
        cache_rows = (slots[:, None, :] * Hkv + torch.arange(Hkv, device=q.device)[None, :, None]).reshape(-1)
        k = k_cache.view(-1, D).index_select(0, cache_rows).view(Bd, Hkv, L, D).float()
        v = v_cache.view(-1, D).index_select(0, cache_rows).view(Bd, Hkv, L, D).float()
        qg = qd.float().view(Bd, Hkv, group, D)
        scores = torch.matmul(qg, k.transpose(2, 3)) * scale  # [Bd, Hkv, G, L]
        pad = pos[None, :] >= lens_t[:, None]
        scores.masked_fill_(pad[:, None, None, :], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        o = torch.matmul(probs, v)  # [Bd, Hkv, G, D]
        o = o.reshape(Bd, Hq, D).to(q.dtype)
        if len(decodes) == len(lens):
            out.copy_(o)
        else:
            out[torch.tensor(rows, device=q.device)] = o
    for b, seq_len in enumerate(lens):
        s, e = starts[b], starts[b + 1]
        q_len = e - s
        if q_len <= 1:
            continue
        n_blocks = (seq_len + bs - 1) // bs
        blocks = block_tables[b, :n_blocks].long()
        k = k_cache[blocks].reshape(n_blocks * bs, Hkv, D)[:seq_len].float().transpose(0, 1)
        v = v_cache[blocks].reshape(n_blocks * bs, Hkv, D)[:seq_len].float().transpose(0, 1)
        qb = q[s:e].float().transpose(0, 1)  # [Hq, q_len, D]
        if group > 1:
            k = k.repeat_interleave(group, dim=0)
            v = v.repeat_interleave(group, dim=0)
        if q_len == seq_len:
            o = F.scaled_dot_product_attention(qb, k, v, is_causal=True, scale=scale)
        else:
            q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)[:, None]
            mask = torch.arange(seq_len, device=q.device)[None, :] <= q_pos
            o = F.scaled_dot_product_attention(qb, k, v, attn_mask=mask, scale=scale)
        out[s:e] = o.transpose(0, 1).to(q.dtype)
    return out
