"""Write the new tokens' keys and values into their slots of the paged cache.

    k, v            [T, Hkv, D]
    k_cache/v_cache [num_blocks, block_size, Hkv, D]
    slot_mapping    [T] int64: slot = block_id * block_size + offset; a negative slot is skipped
"""

from __future__ import annotations

import torch


def write_kv_ref(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
    nb, bs, hkv, d = k_cache.shape
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    k_cache.view(nb * bs, hkv, d).index_copy_(0, slots, k[keep].to(k_cache.dtype))
    v_cache.view(nb * bs, hkv, d).index_copy_(0, slots, v[keep].to(v_cache.dtype))
