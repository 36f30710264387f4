"""Which KV slots an engine may read: a test poisons the rest after every step."""

from __future__ import annotations

import torch


def unread_slots(eng) -> torch.Tensor:
    """[blocks, block_size] True where a slot holds no computed token of a running request
    and no cached prefix block: rejected drafts' slots, trimmed and free blocks."""
    bs = eng.block_size
    keep = torch.zeros(eng.num_kv_blocks, bs, dtype=torch.bool)
    for block in eng.kv.pool.blocks:
        if block.block_hash is not None:
            keep[block.block_id] = True
    for req in eng.scheduler.running:
        for i, block_id in enumerate(req.block_ids):
            keep[block_id, :min(bs, max(0, req.num_computed_tokens - i * bs))] = True
    return ~keep
