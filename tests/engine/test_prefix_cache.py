"""Prefix caching changes nothing in the outputs, only the work: greedy tokens identical
with caching on and off (and to HF) for shared prefixes, late arrivals reusing LRU blocks,
eviction pressure and preemption."""

from __future__ import annotations

import random

import pytest

from inflight.engine import Engine, EngineConfig, SamplingParams

GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)


def shared_prompts(n=8, prefix_len=27, seed=0, n_prefixes=1):
    rng = random.Random(seed)
    prefixes = [[rng.randrange(5, 320) for _ in range(prefix_len)] for _ in range(n_prefixes)]
    return [prefixes[i % n_prefixes] + [rng.randrange(5, 320) for _ in range(rng.randint(1, 9))]
            for i in range(n)]


def run(path, prompts, caching, staggered=False, **kw):
    kw.setdefault("num_kv_blocks", 128)
    kw.setdefault("block_size", 4)
    eng = Engine(EngineConfig(model=path, enable_prefix_caching=caching, debug_checks=True, **kw))
    if staggered:  # each request after the previous one has finished
        outs = [eng.generate([p], GREEDY)[0] for p in prompts]
    else:
        outs = eng.generate(prompts, GREEDY)
    assert eng.stats()["kv_blocks_used"] == 0
    return outs, eng.stats()


@pytest.mark.parametrize("case", [
    pytest.param(dict(max_num_batched_tokens=64), id="shared-batch"),
    pytest.param(dict(staggered=True), id="after-sharer-finished"),
    pytest.param(dict(num_kv_blocks=20, n_prefixes=2, staggered=True), id="eviction"),
    pytest.param(dict(num_kv_blocks=16, max_num_batched_tokens=64), id="preemption"),
    pytest.param(dict(max_num_batched_tokens=8), id="chunked"),
])
def test_outputs_identical_with_and_without_caching(tiny_model_path, hf_ref, case):
    case = dict(case)
    prompts = shared_prompts(n_prefixes=case.pop("n_prefixes", 1))
    on, s_on = run(tiny_model_path, prompts, True, **case)
    off, s_off = run(tiny_model_path, prompts, False, **case)
    assert [o.token_ids for o in on] == [o.token_ids for o in off]
    assert [o.token_ids for o in on] == [hf_ref.greedy(tiny_model_path, p, 10) for p in prompts]
    assert s_on["prefix_cache_hit_tokens"] > 0 and s_off["prefix_cache_hit_tokens"] == 0
    assert s_on["prefill_tokens"] < s_off["prefill_tokens"]
    assert sum(o.num_cached_tokens for o in on) > 0 and all(o.num_cached_tokens == 0 for o in off)
    if case.get("num_kv_blocks") == 20:
        assert s_on["prefix_cache_evictions"] > 0
    if case.get("num_kv_blocks") == 16:
        assert s_on["preemptions"] > 0


def test_fully_cached_prompt_recomputes_its_last_block(tiny_model_path):
    prompt = shared_prompts(1, prefix_len=16)[0][:16]  # exactly 4 blocks of 4
    eng = Engine(EngineConfig(model=tiny_model_path, block_size=4, num_kv_blocks=64, debug_checks=True))
    first = eng.generate([prompt], GREEDY)[0]
    second = eng.generate([prompt], GREEDY)[0]
    assert first.num_cached_tokens == 0 and second.num_cached_tokens == 12
    assert second.token_ids == first.token_ids


def test_stats_and_hit_rate(tiny_model_path):
    prompts = shared_prompts(4, prefix_len=20)
    eng = Engine(EngineConfig(model=tiny_model_path, block_size=4, num_kv_blocks=64, debug_checks=True))
    eng.generate(prompts[:1], GREEDY)
    outs = eng.generate(prompts[1:], GREEDY)
    s = eng.stats()
    assert all(o.num_cached_tokens == 20 for o in outs)
    assert s["prefix_cache_hit_tokens"] == 60
    assert s["prefix_cache_queries"] == sum(map(len, prompts))
    assert s["prefix_cache_hit_rate"] == pytest.approx(60 / sum(map(len, prompts)))
    assert s["prefix_cache_blocks"] > 0 and s["prefix_cache_evictions"] == 0


def test_abort_releases_shared_blocks(tiny_model_path):
    prompts = shared_prompts(4, prefix_len=20)
    eng = Engine(EngineConfig(model=tiny_model_path, block_size=4, num_kv_blocks=64, debug_checks=True))
    for i, p in enumerate(prompts):
        eng.add_request(str(i), prompt_token_ids=p, params=GREEDY)
    eng.step()
    eng.step()
    eng.abort("0")
    eng.abort("2")
    while eng.has_unfinished():
        eng.step()
    eng.kv.check_invariants([])
    assert eng.stats()["kv_blocks_used"] == 0


def test_burst_of_sharers_computes_the_prefix_once(tiny_model_path, hf_ref):
    prompts = shared_prompts(6, prefix_len=24)  # 6 full blocks of 4 shared
    on, s = run(tiny_model_path, prompts, True)  # all arrive together, budget fits all
    assert [o.num_cached_tokens for o in on] == [0] + [24] * 5
    assert s["prefill_tokens"] == sum(map(len, prompts)) - 5 * 24
    assert [o.token_ids for o in on] == [hf_ref.greedy(tiny_model_path, p, 10) for p in prompts]
