"""Logprobs: sampled tokens' (`SamplingParams.logprobs`), prompt tokens'
(`prompt_logprobs`) and `Engine.score`, against `transformers`' log-softmax on the same
weights (fp32, within 1e-4), through chunked prefill, preemption, the padded decode path
with overlapped outputs, and the prefix cache."""

from __future__ import annotations

import math

import pytest
import torch

from inflight.engine import Engine, EngineConfig, SamplingParams, SamplingParamsError
from inflight.engine.logprobs import MAX_LOGPROBS

TOL = 1e-4


@pytest.fixture(scope="module")
def hf_log_softmax(tiny_model_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()

    def lsm(ids: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            return model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
    return lsm


def check_against_hf(out, prompt, lsm, n_top, n_prompt_top):
    ids = list(prompt) + list(out.token_ids)
    ref = lsm(ids)
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
    for i in range(1, len(prompt)):
        e = out.prompt_logprobs[i]
        assert e.token_id == prompt[i]
        assert abs(e.logprob - ref[i - 1, prompt[i]].item()) < TOL
        assert e.rank == int((ref[i - 1] > ref[i - 1, prompt[i]]).sum()) + 1
        check_top(e, ref[i - 1], n_prompt_top)
    assert len(out.logprobs) == len(out.token_ids)
    for j, e in enumerate(out.logprobs):
        pos = len(prompt) - 1 + j
        assert e.token_id == ids[pos + 1]
        assert abs(e.logprob - ref[pos, ids[pos + 1]].item()) < TOL
        check_top(e, ref[pos], n_top)


def check_top(entry, ref_row, n):
    assert len(entry.top) == n
    want = ref_row.topk(n) if n else None
    for (tok, lp), w_lp in zip(entry.top, want.values.tolist() if n else []):
        assert abs(lp - w_lp) < TOL and abs(ref_row[tok].item() - lp) < TOL
    assert [lp for _, lp in entry.top] == sorted((lp for _, lp in entry.top), reverse=True)


@pytest.mark.parametrize("kw", [
    pytest.param({}, id="all-at-once"),
    pytest.param({"max_num_batched_tokens": 16, "block_size": 4}, id="chunked-prefill"),
    pytest.param({"num_kv_blocks": 12, "max_num_batched_tokens": 64}, id="preemption"),
    pytest.param({"cuda_graphs": True, "overlap_outputs": True}, id="padded-decode-overlapped"),
])
def test_logprobs_match_transformers(tiny_model_path, prompts, hf_log_softmax, kw):
    kw.setdefault("num_kv_blocks", 256)
    eng = Engine(EngineConfig(model=tiny_model_path, debug_checks=True, **kw))
    greedy = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=3, prompt_logprobs=2)
    sampled = SamplingParams(max_tokens=6, temperature=0.8, top_k=20, seed=7, ignore_eos=True,
                             logprobs=0, prompt_logprobs=0)
    params = [greedy if i % 2 == 0 else sampled for i in range(len(prompts))]
    outs = eng.generate(prompts, params)
    for prompt, p, out in zip(prompts, params, outs):
        check_against_hf(out, prompt, hf_log_softmax, p.logprobs, p.prompt_logprobs)
        if p is greedy:
            assert all(e.rank == 1 and e.top[0][0] == e.token_id for e in out.logprobs)
    if kw.get("num_kv_blocks") == 12:
        assert eng.stats()["preemptions"] > 0


def test_streamed_logprobs_are_deltas_and_plain_requests_carry_none(tiny_model_path, prompts):
    eng = Engine(EngineConfig(model=tiny_model_path, num_kv_blocks=64))
    eng.add_request("lp", prompt_token_ids=prompts[0],
                    params=SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True, logprobs=1))
    eng.add_request("plain", prompt_token_ids=prompts[1],
                    params=SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True))
    streamed, finals = [], {}
    while eng.has_unfinished():
        for out in eng.step():
            if out.finished:
                finals[out.request_id] = out
            elif out.request_id == "lp":
                assert len(out.logprobs) == len(out.new_token_ids) == 1
                streamed += out.logprobs
            else:
                assert out.logprobs is None
    lp = finals["lp"]
    assert streamed == lp.logprobs[:len(streamed)] and len(lp.logprobs) == 5
    assert [e.token_id for e in lp.logprobs] == lp.token_ids and lp.prompt_logprobs is None
    assert finals["plain"].logprobs is None and finals["plain"].prompt_logprobs is None


def test_prompt_logprobs_bypass_the_prefix_cache(tiny_model_path, prompts, hf_log_softmax):
    """A prompt whose blocks are all cached is still computed whole for its logprobs; a
    plain request after it still takes the cache hits."""
    eng = Engine(EngineConfig(model=tiny_model_path, num_kv_blocks=64, block_size=4))
    prompt = max(prompts, key=len)
    plain = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    eng.generate([prompt], plain)
    scored = eng.generate([prompt], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True,
                                                   prompt_logprobs=1))[0]
    assert scored.num_cached_tokens == 0 and len(scored.prompt_logprobs) == len(prompt)
    ref = hf_log_softmax(prompt)
    for i in range(1, len(prompt)):
        assert abs(scored.prompt_logprobs[i].logprob - ref[i - 1, prompt[i]].item()) < TOL
    again = eng.generate([prompt], plain)[0]
    assert again.num_cached_tokens >= len(prompt) - 4


def test_score_gives_the_perplexity_of_transformers(tiny_model_path, prompts, hf_log_softmax):
    eng = Engine(EngineConfig(model=tiny_model_path, num_kv_blocks=64, max_num_batched_tokens=32))
    texts = ["the quick brown fox jumps over the lazy dog", prompts[3], prompts[7]]
    scores = eng.score(texts)
    for text, s in zip(texts, scores):
        ids = eng.tokenizer.encode(text) if isinstance(text, str) else text
        assert s.token_ids == ids and s.logprobs[0] is None and len(s.logprobs) == len(ids)
        ref = hf_log_softmax(ids)
        nll = -sum(ref[i - 1, ids[i]].item() for i in range(1, len(ids))) / (len(ids) - 1)
        assert abs(s.perplexity - math.exp(nll)) < 1e-4 * math.exp(nll)


def test_score_refuses_what_it_cannot_score(tiny_model_path):
    from inflight.engine.engine import ScoreError

    eng = Engine(EngineConfig(model=tiny_model_path, num_kv_blocks=64, max_model_len=32))
    with pytest.raises(ScoreError, match="cannot score"):
        eng.score([list(range(5, 40))])


@pytest.mark.parametrize("bad", [-1, MAX_LOGPROBS + 1, True, 2.0])
def test_logprob_counts_are_checked(bad):
    for name in ("logprobs", "prompt_logprobs"):
        with pytest.raises(SamplingParamsError, match=name):
            SamplingParams(**{name: bad})
