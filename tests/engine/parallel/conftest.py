"""Tensor-parallel groups (gloo, on this CPU) shared by the module's engines, and tiny
models whose head counts shard over 2 and 3 ranks.

    llama   6 heads, 6 KV heads            (KV heads >= ranks: each rank its own)
    qwen2   6 heads, 1 KV head, q/k/v bias (KV heads < ranks: the head is replicated)
    qwen3   12 heads, 6 KV heads, head_dim 16, q/k norms per head
    quant   llama, 6 heads of 32, MLP 192  (w4 groups of 32 stay whole on 2 and 3 ranks)
    gemma3, phi3   tests/tiny_families.py's (4 heads, 2 KV heads): Gemma's norms, GELU and
                   embedding scale; Phi-3's fused qkv_proj / gate_up_proj

The vocabulary (320) does not divide by 3: the last rank's LM-head shard is padded.
"""

from __future__ import annotations

import pytest

from tests.tiny_families import write_tiny_family
from tests.tiny_llama import write_tiny_llama

WORLDS = (2, 3)


@pytest.fixture(scope="session")
def tp_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp-models")
    return {
        "llama": write_tiny_llama(root / "llama", hidden_size=48, num_heads=6, num_kv_heads=6,
                                  intermediate_size=96),
        "qwen2": write_tiny_family(root / "qwen2", "qwen2", hidden_size=48, num_attention_heads=6,
                                   num_key_value_heads=1, intermediate_size=96),
        "qwen3": write_tiny_family(root / "qwen3", "qwen3", num_attention_heads=12,
                                   num_key_value_heads=6, head_dim=16, intermediate_size=96),
        "gemma3": write_tiny_family(root / "gemma3", "gemma3"),
        "phi3": write_tiny_family(root / "phi3", "phi3"),
        "quant": write_tiny_llama(root / "quant", hidden_size=192, num_heads=6, num_kv_heads=6,
                                  intermediate_size=192),
    }


@pytest.fixture(scope="session")
def tp_groups():
    """world -> a running TensorParallelGroup on the CPU (started on first use)."""
    import torch

    from inflight.engine.parallel import TensorParallelGroup

    groups: dict[int, TensorParallelGroup] = {}

    def get(world: int) -> TensorParallelGroup:
        if world not in groups:
            groups[world] = TensorParallelGroup(world, torch.device("cpu"))
        return groups[world]

    try:
        yield get
    finally:
        for g in groups.values():
            g.close()
