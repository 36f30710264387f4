"""TP=2 and TP=3 produce TP=1's greedy tokens: batched, with prefix caching and logprobs,
chunked and preempted and overlapped, quantized (w8, w4), on Llama, Qwen2 and Qwen3 shapes;
Gemma 3 and Phi-3 (fused projections) on two ranks.

NOTE: exact tokens, not exact logits. The row-parallel all-reduces add the ranks' partial
sums in another order than one matmul does (fp32: ~1e-7 apart); the tiny models' logits
are peaked (tests/tiny_llama.py scales the weights), so no greedy argmax is near a tie.
"""

from __future__ import annotations

import pytest

from inflight.engine import Engine, EngineConfig, SamplingParams
from tests.engine.parallel.conftest import WORLDS
from tests.tiny_llama import tiny_prompts

N = 10
GREEDY = SamplingParams(max_tokens=N, temperature=0.0, ignore_eos=True)
LOGPROBS = SamplingParams(max_tokens=N, temperature=0.0, ignore_eos=True, logprobs=2, prompt_logprobs=1)
SEEDED = SamplingParams(max_tokens=N, temperature=0.8, top_p=0.9, seed=7, ignore_eos=True)

PREFIX = tiny_prompts(1, min_len=20, max_len=20, seed=5)[0]
SHARED = [PREFIX + p for p in tiny_prompts(3, min_len=2, max_len=9, seed=6)]
BATCH = SHARED + tiny_prompts(3, max_len=30, seed=7)
BATCH_PARAMS = [GREEDY, LOGPROBS, SEEDED] + [GREEDY] * 3

SCENARIOS = {
    # all at once; prefix hits on SHARED; decodes through the padded (graph-shaped) path
    "batched-prefix-logprobs": dict(num_kv_blocks=64, block_size=4, cuda_graphs=True),
    # 16-token steps, too few blocks for everyone (preemption), outputs one step behind
    "chunked-preempted-overlapped": dict(num_kv_blocks=14, block_size=4, max_num_batched_tokens=16,
                                         overlap_outputs=True),
}
_refs: dict = {}


def run(path, world=1, group=None, **kw):
    cfg = EngineConfig(model=str(path), debug_checks=True, tensor_parallel_size=world, **kw)
    eng = Engine(cfg, parallel_group=group)
    try:
        return eng.generate(BATCH, BATCH_PARAMS), eng.stats()
    finally:
        eng.close()


def reference(path, scenario, **kw):
    key = (str(path), scenario)
    if key not in _refs:
        _refs[key] = run(path, **SCENARIOS[scenario], **kw)
    return _refs[key]


def same(got, want):
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert [o.finish_reason for o in got] == ["length"] * len(want)


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_tokens_match_tp1(tp_models, tp_groups, family, world, scenario):
    path = tp_models[family]
    want, want_stats = reference(path, scenario)
    got, stats = run(path, world, tp_groups(world), **SCENARIOS[scenario])
    same(got, want)
    if scenario.startswith("batched"):
        assert stats["prefix_cache_hit_rate"] > 0
        lp, ref = got[1], want[1]
        assert [e.token_id for e in lp.logprobs] == [e.token_id for e in ref.logprobs]
        assert [e.logprob for e in lp.logprobs] == pytest.approx([e.logprob for e in ref.logprobs], abs=1e-4)
        assert [e.logprob for e in lp.prompt_logprobs[1:]] == pytest.approx(
            [e.logprob for e in ref.prompt_logprobs[1:]], abs=1e-4)
    else:
        assert stats["preemptions"] > 0 and want_stats["preemptions"] > 0


@pytest.mark.parametrize("family", ["gemma3", "phi3"])
def test_other_families_match_tp1_on_two_ranks(tp_models, tp_groups, family):
    path = tp_models[family]
    want, _ = reference(path, "batched-prefix-logprobs")
    got, _ = run(path, 2, tp_groups(2), **SCENARIOS["batched-prefix-logprobs"])
    same(got, want)


@pytest.fixture(scope="module")
def quantized_models(tp_models, tmp_path_factory):
    from tests.quant_models import quantized

    root = tmp_path_factory.mktemp("tp-quant")
    return {"w8": quantized(tp_models["quant"], root / "w8", "w8"),
            "w4": quantized(tp_models["quant"], root / "w4", "w4", 32)}


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("scheme", ["w8", "w4"])
def test_quantized_tokens_match_tp1(quantized_models, tp_groups, scheme, world):
    path = quantized_models[scheme]
    kw = SCENARIOS["chunked-preempted-overlapped"]
    want, _ = reference(path, "chunked-preempted-overlapped")
    got, _ = run(path, world, tp_groups(world), **kw)
    same(got, want)
