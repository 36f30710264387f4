"""Write the new tokens' keys and values into their slots of the paged cache.

    k, v            [T, Hkv, D]
    k_cache/v_cache [num_blocks, block_size, Hkv, D]
    slot_mapping    [T] int64: slot = block_id * block_size + offset; a negative slot is skipped
    k_scale/v_scale [num_blocks, block_size, Hkv] fp16, only for an 8-bit cache (int8 or
                    fp8): each token's values are quantized on the way in (kernels/kv_quant.py)
"""

from __future__ import annotations

import torch

from inflight.kernels.kv_quant import is_quantized, quantize_kv


def write_kv_ref(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor, k_scale: torch.Tensor | None = None,
                 v_scale: torch.Tensor | None = None) -> None:
    nb, bs, hkv, d = k_cache.shape
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    if not is_quantized(k_cache.dtype):
        k_cache.view(nb * bs, hkv, d).index_copy_(0, slots, k[keep].to(k_cache.dtype))
        v_cache.view(nb * bs, hkv, d).index_copy_(0, slots, v[keep].to(v_cache.dtype))
        return
    assert k_scale is not None and v_scale is not None, "an 8-bit KV cache needs its scales"
    for x, cache, scales in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        values, s = quantize_kv(x[keep], cache.dtype)
        # NOTE: through uint8 views: index_copy_ has no float8 kernel on CPU
        cache.view(torch.uint8).view(nb * bs, hkv, d).index_copy_(0, slots, values.view(torch.uint8))
        scales.view(nb * bs, hkv).index_copy_(0, slots, s)
