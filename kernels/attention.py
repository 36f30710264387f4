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
