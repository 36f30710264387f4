"""The shard plan: which rows and columns each rank takes, and the sizes it refuses."""

from __future__ import annotations

import pytest
import torch

from inflight.engine.errors import ConfigError
from inflight.engine.model_config import ModelConfig
from inflight.engine.parallel.shard import ShardPlan


class Slice:
    """What safetensors' lazy slice offers, over a tensor."""

    def __init__(self, t: torch.Tensor):
        self.t = t

    def __getitem__(self, key):
        return self.t[key]


def plan(rank, world, heads=6, kv=2, head_dim=4, inter=24, vocab=10, group_size=None):
    return ShardPlan(rank, world, heads, kv, head_dim, inter, vocab, group_size)


def take(p: ShardPlan, name: str, t: torch.Tensor) -> torch.Tensor:
    return p.take(name, Slice(t), list(t.shape))


def test_heads_and_kv_heads_per_rank():
    # 6 heads, 2 KV heads (groups of 3) over 2 ranks: one KV head each
    assert [(plan(r, 2).q_cols, plan(r, 2).kv_rows) for r in range(2)] == [((0, 12), (0, 4)), ((12, 24), (4, 8))]
    # fewer KV heads than ranks: 6 heads, 2 KV heads over 6 ranks -> ranks 0-2 read KV head 0
    kv_first = [plan(r, 6).kv_first for r in range(6)]
    assert kv_first == [0, 0, 0, 1, 1, 1]
    # rank r's query heads all map to its KV head (head j reads KV head j // 3)
    for r in range(6):
        p = plan(r, 6)
        heads = range(p.q_cols[0] // 4, p.q_cols[1] // 4)
        assert {h // 3 for h in heads} == {p.kv_first} and p.kv_heads == 1


def test_cuts_columns_rows_and_vocabulary():
    W = torch.arange(24 * 8, dtype=torch.float32).view(24, 8)   # o_proj [hidden, heads*hd]
    p = plan(1, 2, head_dim=4)
    assert torch.equal(take(p, "model.layers.0.self_attn.q_proj.weight", torch.arange(24.)), torch.arange(12., 24.))
    o = torch.arange(8 * 24, dtype=torch.float32).view(8, 24)
    assert torch.equal(take(p, "model.layers.0.self_attn.o_proj.weight", o), o[:, 12:])
    assert torch.equal(take(p, "model.layers.0.self_attn.o_proj.bias", torch.ones(8)), torch.zeros(8))
    assert torch.equal(take(plan(0, 2), "model.layers.0.self_attn.o_proj.bias", torch.ones(8)), torch.ones(8))
    assert torch.equal(take(p, "model.layers.1.mlp.down_proj.weight", W[:8, :].T.contiguous()[:8]),
                       W[:8, :].T.contiguous()[:8][:, 12:])
    assert torch.equal(take(p, "model.norm.weight", torch.ones(8)), torch.ones(8))
    assert torch.equal(take(p, "model.layers.0.self_attn.q_norm.weight", torch.ones(4)), torch.ones(4))
    # vocabulary 10 over 3 ranks: 4 rows each, the last padded with zeros
    emb = torch.arange(10 * 2, dtype=torch.float32).view(10, 2) + 1
    parts = [take(plan(r, 3, heads=6, kv=3, inter=24), "model.embed_tokens.weight", emb) for r in range(3)]
    assert [tuple(x.shape) for x in parts] == [(4, 2)] * 3
    assert torch.equal(torch.cat(parts)[:10], emb) and not parts[2][2:].any()


def test_phi3_fused_projections_cut_per_part():
    heads, kv, hd, inter = 6, 2, 4, 24
    q, k = heads * hd, kv * hd
    qkv = torch.arange(q + 2 * k, dtype=torch.float32)
    gate_up = torch.arange(2 * inter, dtype=torch.float32)
    for r in range(2):
        p = plan(r, 2, heads, kv, hd, inter)
        a, b = p.q_cols
        c, d = p.kv_rows
        want = torch.cat([qkv[a:b], qkv[q + c:q + d], qkv[q + k + c:q + k + d]])
        assert torch.equal(take(p, "model.layers.0.self_attn.qkv_proj.weight", qkv), want)
        m0, m1 = p.mlp_rows
        assert torch.equal(take(p, "model.layers.0.mlp.gate_up_proj.weight", gate_up),
                           torch.cat([gate_up[m0:m1], gate_up[inter + m0:inter + m1]]))


def test_quantized_row_parallel_cuts_bytes_and_groups():
    p = plan(1, 2, heads=4, kv=2, head_dim=16, inter=128, group_size=32)  # o: K 64 -> 32 per rank
    qw = torch.arange(8 * 32, dtype=torch.int32).view(8, 32).to(torch.uint8)  # w4 [N, K/2]
    assert torch.equal(take(p, "layers.0.self_attn.o_proj.qweight", qw), qw[:, 16:])
    scales = torch.arange(8 * 2, dtype=torch.float16).view(8, 2)
    assert torch.equal(take(p, "layers.0.self_attn.o_proj.scales", scales), scales[:, 1:])
    w8 = plan(1, 2, heads=4, kv=2, head_dim=16, inter=128)
    q8 = torch.arange(8 * 128, dtype=torch.int32).view(8, 128).to(torch.int8)  # down: K 128
    assert torch.equal(take(w8, "layers.0.mlp.down_proj.qweight", q8), q8[:, 64:])
    assert torch.equal(take(w8, "layers.0.mlp.down_proj.scales", scales[:, 0]), scales[:, 0])


@pytest.mark.parametrize("kw, match", [
    (dict(heads=6, kv=6, world=4), "num_attention_heads=6"),
    (dict(heads=8, kv=6, world=4), "num_key_value_heads=6"),
    (dict(heads=6, kv=2, world=3), "num_key_value_heads=2 does not divide"),
    (dict(heads=4, kv=4, world=4, inter=30), "intermediate_size=30"),
    (dict(heads=6, kv=6, world=2, head_dim=8, group_size=32), "o_proj's K into 24-column"),
])
def test_sizes_that_do_not_shard_are_refused(kw, match):
    world = kw.pop("world")
    with pytest.raises(ConfigError, match=match):
        plan(0, world, **kw).check()


def test_local_config_keeps_the_vocabulary():
    cfg = ModelConfig(vocab_size=320, hidden_size=64, num_layers=2, num_heads=6, num_kv_heads=2,
                      head_dim=8, intermediate_size=96, rms_norm_eps=1e-6, rope_theta=1e4,
                      max_position_embeddings=64, tie_word_embeddings=True, attention_bias=False,
                      eos_token_ids=(1,), bos_token_id=2)
    local = ShardPlan.of(cfg, 1, 2).local_config(cfg)
    assert (local.num_heads, local.num_kv_heads, local.intermediate_size, local.vocab_size) == (3, 1, 48, 320)
