"""`n` > 1 siblings (api/follow.py `answer_siblings`): four requests with one prompt that
arrive together compute the prompt once; the other three take its full blocks from the
prefix cache (the scheduler waits a step for a block being computed: next_block_in)."""

from __future__ import annotations

from inflight.engine import Engine, EngineConfig, SamplingParams
from inflight.engine.sampling_params import seed_for


def test_four_siblings_compute_the_prompt_once(tiny_model_path):
    prompt = list(range(5, 32))  # 27 tokens: 6 full blocks of 4 and 3 more
    eng = Engine(EngineConfig(model=tiny_model_path, block_size=4, num_kv_blocks=128,
                              max_num_seqs=8, debug_checks=True))
    for i in range(4):
        eng.add_request(f"parent-{i}", prompt_token_ids=prompt,
                        params=SamplingParams(max_tokens=6, temperature=1.0, ignore_eos=True,
                                              seed=seed_for(f"parent-{i}")))
    outs = {}
    for _ in range(200):
        for out in eng.step():
            if out.finished:
                outs[out.request_id] = out
        if len(outs) == 4:
            break
    assert len(outs) == 4 and all(len(o.token_ids) == 6 for o in outs.values())
    stats = eng.stats()
    full = 24  # the shared full blocks: computed by one sibling, hit by the other three
    assert stats["prefix_cache_hit_tokens"] == 3 * full
    assert stats["prefill_tokens"] == 27 + 3 * (27 - full)
    assert sorted(o.num_cached_tokens for o in outs.values()) == [0, full, full, full]
