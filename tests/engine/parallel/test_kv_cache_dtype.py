"""TP=2 with an 8-bit KV cache gives TP=1's tokens with the same cache: every follower rank
builds its model with the leader's kv_cache_dtype (LOAD's JSON), quantizes its own heads'
keys and values (one scale per token and head: no rank needs another's), and holds as many
blocks as rank 0.

NOTE: fp8 on these tiny models changes most greedy tokens against the fp32 cache (their
logits are peaked, e4m3 has 3 mantissa bits): a follower caching in fp32 while rank 0
caches fp8 would not give TP=1's fp8 tokens, which the test checks it can tell apart."""

from __future__ import annotations

import pytest

from tests.engine.parallel.test_exactness import SCENARIOS, run, same


@pytest.mark.parametrize("name", ["int8", "fp8"])
@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_8bit_kv_tokens_match_tp1(tp_models, tp_groups, family, name, scenario):
    path = tp_models[family]
    kw = dict(SCENARIOS[scenario], kv_cache_dtype=name)
    want, want_stats = run(path, **kw)
    got, stats = run(path, 2, tp_groups(2), **kw)
    same(got, want)
    if scenario.startswith("batched"):
        assert stats["prefix_cache_hit_rate"] > 0
    else:
        assert stats["preemptions"] > 0 and want_stats["preemptions"] > 0
    if name == "fp8" and scenario.startswith("batched"):
        auto, _ = run(path, **SCENARIOS[scenario])
        assert [o.token_ids for o in auto] != [o.token_ids for o in want]
