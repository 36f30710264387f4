"""The 8-bit KV cache in the engine (`kv_cache_dtype` int8 / fp8): config and its sources,
the blocks a byte budget buys, greedy agreement with the model dtype's cache, and the
features that move or share blocks (prefix caching, preemption, speculative decoding with
its roll-back) giving the tokens a plain engine with the same 8-bit cache gives."""

from __future__ import annotations

import pytest
import torch

from inflight.engine import Engine, EngineConfig, SamplingParams
from inflight.engine.errors import ConfigError
from inflight.kernels.kv_quant import SCALE_DTYPE
from tests.engine.kv_slots import unread_slots
from tests.tiny_llama import tiny_prompts, write_tiny_llama

N = 16
GREEDY = SamplingParams(max_tokens=N, temperature=0.0, ignore_eos=True)
KV8 = ["int8", "fp8"]


@pytest.fixture(scope="module")
def calm_model_path(tmp_path_factory):
    """The tiny Llama with weights scaled x4 rather than x8: attention logits small enough
    that a 3-mantissa-bit (fp8) key does not flip which token wins on most steps."""
    return write_tiny_llama(tmp_path_factory.mktemp("calm") / "calm", weight_scale=4.0)


def test_config_names_the_allowed_values(tiny_model_path):
    with pytest.raises(ConfigError, match=r"kv_cache_dtype='fp16'.*'auto', 'int8', 'fp8'"):
        EngineConfig(model=tiny_model_path, kv_cache_dtype="fp16")
    assert EngineConfig(model=tiny_model_path).kv_torch_dtype == torch.float32
    assert EngineConfig(model=tiny_model_path, dtype="bfloat16").kv_torch_dtype == torch.bfloat16
    assert EngineConfig(model=tiny_model_path, kv_cache_dtype="int8").kv_torch_dtype == torch.int8
    for name in ("fp8", "fp8_e4m3"):
        assert EngineConfig(model=tiny_model_path, kv_cache_dtype=name).kv_torch_dtype == torch.float8_e4m3fn


def test_a_worker_engine_takes_it_from_the_settings(tiny_model_path, monkeypatch):
    from inflight.consumers.engine_bridge import build_engine
    from inflight.schemas.settings import Settings

    monkeypatch.setenv("INFLIGHT_KV_CACHE_DTYPE", "fp8")
    settings = Settings(model_path=str(tiny_model_path), kv_cache_bytes=4 << 20)
    eng = build_engine(settings)
    assert eng.config.kv_cache_dtype == "fp8" and eng.runner.kv_caches[0][0].dtype == torch.float8_e4m3fn
    eng = build_engine(settings.updated(kv_cache_dtype="int8"))
    assert eng.runner.kv_caches[0][0].dtype == torch.int8


def test_environment_and_worker_flag(monkeypatch):
    from inflight.cli.main import build_parser
    from inflight.cli.commands import with_flags
    from inflight.schemas.settings import Settings

    assert "kv_cache_dtype" not in Settings().engine_options()
    monkeypatch.setenv("INFLIGHT_KV_CACHE_DTYPE", "int8")
    assert Settings().engine_options()["kv_cache_dtype"] == "int8"
    args = build_parser().parse_args(["worker", "--kv-cache-dtype", "fp8"])
    assert with_flags(args, Settings()).engine_options()["kv_cache_dtype"] == "fp8"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["worker", "--kv-cache-dtype", "int4"])


@pytest.mark.parametrize("dtype,ratio", [("float32", 4 * 16 / 18), ("bfloat16", 2 * 16 / 18)])
def test_a_byte_budget_holds_more_blocks(tiny_model_path, dtype, ratio):
    """Head dim 16 here: 16 values + a 2-byte scale per token-head against 16 x 4 (fp32) or
    16 x 2 (bf16) bytes; SmolLM2's head dim 64 gives 3.88x / 1.94x (docs/engine.md)."""
    budget = 4 << 20
    auto = Engine(EngineConfig(model=tiny_model_path, dtype=dtype, kv_cache_bytes=budget))
    for name, want in (("int8", torch.int8), ("fp8", torch.float8_e4m3fn)):
        eng = Engine(EngineConfig(model=tiny_model_path, dtype=dtype, kv_cache_bytes=budget,
                                  kv_cache_dtype=name))
        assert eng.num_kv_blocks == pytest.approx(auto.num_kv_blocks * ratio, rel=0.01)
        k, v, ks, vs = eng.runner.kv_caches[0]
        assert k.dtype == v.dtype == want and ks.dtype == vs.dtype == SCALE_DTYPE
        assert ks.shape == k.shape[:3] and k.shape[0] == eng.num_kv_blocks
        held = sum(t.numel() * t.element_size() for layer in eng.runner.kv_caches for t in layer)
        assert held == eng.num_kv_blocks * eng.model.kv_bytes_per_block(16) <= budget


@pytest.mark.parametrize("name,max_lp_diff", [("int8", 0.08), ("fp8", 0.35)])
def test_greedy_agreement_and_logprobs_close_to_auto(calm_model_path, name, max_lp_diff):
    prompts = tiny_prompts(12)
    got, want = (Engine(EngineConfig(model=calm_model_path, kv_cache_dtype=d, num_kv_blocks=128))
                 for d in (name, "auto"))
    a, b = got.generate(prompts, GREEDY), want.generate(prompts, GREEDY)
    same = sum(x == y for o, r in zip(a, b) for x, y in zip(o.token_ids, r.token_ids))
    assert same / (len(prompts) * N) >= 0.9
    lp = torch.tensor([x for s in got.score(prompts) for x in s.logprobs[1:]])
    ref = torch.tensor([x for s in want.score(prompts) for x in s.logprobs[1:]])
    diff = (lp - ref).abs().mean().item()
    assert 0 < diff < max_lp_diff, diff  # 0 would mean the cache was not quantized at all


def poison_unread_scales(eng) -> None:
    """An 8-bit cache cannot hold a huge value, but its scales can: every slot that holds no
    computed token of a running request and no cached prefix block gets a scale of 1e4
    (rejected drafts' slots, trimmed and free blocks)."""
    unread = unread_slots(eng)
    for _, _, ks, vs in eng.runner.kv_caches + (eng.runner.draft_kv_caches or []):
        ks[unread] = 1.0e4
        vs[unread] = 1.0e4


def run_poisoned(eng, prompts):
    for i, p in enumerate(prompts):
        eng.add_request(str(i), prompt_token_ids=p, params=GREEDY)
    finals = {}
    while eng.has_unfinished():
        for out in eng.step():
            if out.finished:
                finals[out.request_id] = out
        poison_unread_scales(eng)
    return [finals[str(i)].token_ids for i in range(len(prompts))]


SPEC = {
    "ngram": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
              "prompt_lookup_max": 3, "disable_by_batch_size": None},
    "self-draft": "draft",
}


def shared_prompts():
    base = tiny_prompts(4, min_len=10, max_len=30, seed=11)
    return base + [p[:8] + q for p, q in zip(base, tiny_prompts(4, max_len=6, seed=12))]


@pytest.mark.parametrize("name", KV8)
@pytest.mark.parametrize("spec", [None, "ngram", "self-draft"])
def test_prefix_cache_preemption_and_speculation_keep_the_tokens(tiny_model_path, name, spec):
    """A busy engine (blocks of 4 and too few of them: preemption; prompts sharing
    prefixes: prefix hits; a 16-token step budget: chunked prefills; speculation when
    asked; every unread slot's scale poisoned after each step) = a plain one with the
    same 8-bit cache, one request at a time, no prefix caching."""
    prompts = shared_prompts()
    plain = Engine(EngineConfig(model=tiny_model_path, kv_cache_dtype=name, num_kv_blocks=256,
                                enable_prefix_caching=False))
    want = [plain.generate([p], GREEDY)[0].token_ids for p in prompts]
    cfg = None if spec is None else SPEC[spec]
    if cfg == "draft":  # the target drafting for itself, its cache 8-bit too
        cfg = {"method": "draft_model", "model": str(tiny_model_path), "num_speculative_tokens": 3,
               "disable_by_batch_size": None}
    eng = Engine(EngineConfig(model=tiny_model_path, kv_cache_dtype=name, num_kv_blocks=16,
                              block_size=4, max_num_batched_tokens=16, max_num_seqs=6,
                              debug_checks=True, speculative_config=cfg))
    assert run_poisoned(eng, prompts) == want
    s = eng.stats()
    assert s["preemptions"] > 0 and s["prefix_cache_hit_tokens"] > 0 and s["kv_blocks_used"] == 0
    if spec is not None:
        assert s["spec_decode_num_accepted_tokens"] > 0
    if spec == "self-draft":
        assert eng.runner.draft_kv_caches[0][0].dtype == eng.runner.kv_caches[0][0].dtype


def test_poisoned_scales_would_be_noticed(tiny_model_path):
    eng = Engine(EngineConfig(model=tiny_model_path, kv_cache_dtype="int8", block_size=4,
                              num_kv_blocks=64))
    prompt = shared_prompts()[0]
    want = eng.generate([prompt], GREEDY)[0].token_ids
    eng.add_request("a", prompt_token_ids=prompt, params=GREEDY)
    eng.step()
    block = eng.requests["a"].block_ids[0]
    for _, _, ks, _ in eng.runner.kv_caches:
        ks[block, 1] = 1.0e4
    finals = {}
    while eng.has_unfinished():
        for out in eng.step():
            finals[out.request_id] = out
    assert finals["a"].token_ids != want
