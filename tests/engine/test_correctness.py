"""Greedy tokens identical to Hugging Face transformers on the same weights."""

from __future__ import annotations

import pytest
import torch

from inflight.engine import Engine, EngineConfig, SamplingParams
from tests.tiny_llama import tiny_prompts, write_tiny_llama

N = 20
GREEDY = SamplingParams(max_tokens=N, temperature=0.0, ignore_eos=True)


def engine(path, **kw):
    kw.setdefault("num_kv_blocks", 256)
    return Engine(EngineConfig(model=path, debug_checks=True, **kw))


def refs(hf_ref, path, prompts, n=N, dtype=torch.float32):
    return [hf_ref.greedy(path, p, n, dtype) for p in prompts]


@pytest.mark.parametrize("kw", [
    pytest.param({}, id="all-at-once"),
    pytest.param({"max_num_batched_tokens": 16}, id="chunked-prefill"),
    pytest.param({"num_kv_blocks": 12, "max_num_batched_tokens": 64}, id="preemption"),
    pytest.param({"max_num_seqs": 3, "block_size": 4}, id="few-seqs-small-blocks"),
])
def test_greedy_matches_hf(tiny_model_path, prompts, hf_ref, kw):
    eng = engine(tiny_model_path, **kw)
    outs = eng.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == refs(hf_ref, tiny_model_path, prompts)
    assert all(o.finish_reason == "length" for o in outs)
    if "num_kv_blocks" in kw:
        assert eng.stats()["preemptions"] > 0
    assert eng.stats()["kv_blocks_used"] == 0


def test_chunked_prefill_really_chunks(tiny_model_path, prompts):
    eng = engine(tiny_model_path, max_num_batched_tokens=16)
    eng.add_request("long", prompt_token_ids=max(prompts, key=len), params=GREEDY)
    eng.step()
    assert eng.stats()["last_step_prefill_tokens"] == 16
    assert eng.requests["long"].num_output_tokens == 0


def test_greedy_matches_hf_staggered_arrivals(tiny_model_path, prompts, hf_ref):
    eng = engine(tiny_model_path, max_num_batched_tokens=48)
    pending = list(enumerate(prompts))
    got: dict[int, list[int]] = {}
    step = 0
    while pending or eng.has_unfinished():
        if pending and step % 2 == 0:  # a new request every other step, mid-flight
            i, p = pending.pop(0)
            eng.add_request(str(i), prompt_token_ids=p, params=GREEDY)
        for out in eng.step():
            if out.finished:
                got[int(out.request_id)] = out.token_ids
        step += 1
    assert [got[i] for i in range(len(prompts))] == refs(hf_ref, tiny_model_path, prompts)


def test_streamed_deltas_add_up(tiny_model_path, prompts):
    eng = engine(tiny_model_path)
    for i, p in enumerate(prompts[:4]):
        eng.add_request(str(i), prompt_token_ids=p, params=GREEDY)
    tokens = {str(i): [] for i in range(4)}
    finals = {}
    while eng.has_unfinished():
        for out in eng.step():
            tokens[out.request_id] += out.new_token_ids
            if out.finished:
                finals[out.request_id] = out
    for rid, out in finals.items():
        assert tokens[rid] == out.token_ids and len(out.token_ids) == N


def test_bf16_first_tokens_match_hf(tiny_model_path, prompts, hf_ref):
    """bf16 rounding differs between any two implementations (fused q|k|v, fp32 attention
    math here), so an exact match is only expected away from near-ties: most prompts must
    match for all 16 tokens, and where one diverges, HF's fp32 logits of the two
    candidate tokens must be within a bf16-noise margin of each other."""
    from transformers import AutoModelForCausalLM

    eng = engine(tiny_model_path, dtype="bfloat16", max_num_batched_tokens=64)
    outs = eng.generate(prompts, SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
    expected = refs(hf_ref, tiny_model_path, prompts, 16, torch.bfloat16)
    exact = sum(o.token_ids == e for o, e in zip(outs, expected))
    assert exact >= 9, f"only {exact}/12 prompts match HF bf16 for 16 tokens"
    hf32 = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    for p, o, e in zip(prompts, outs, expected):
        if o.token_ids == e:
            continue
        i = next(i for i, (a, b) in enumerate(zip(o.token_ids, e)) if a != b)
        with torch.inference_mode():
            logits = hf32(torch.tensor([p + e[:i]])).logits[0, -1]
        gap = abs(logits[o.token_ids[i]] - logits[e[i]]).item()
        assert gap < 1.0, f"diverged at token {i} where the fp32 logit gap is {gap:.3f} (not a near-tie)"


@pytest.mark.parametrize("kw", [
    pytest.param(dict(tie_word_embeddings=False, num_kv_heads=1, rope_theta=500000.0), id="untied-mqa"),
    pytest.param(dict(num_heads=2, num_kv_heads=2, head_dim=64, hidden_size=96, num_layers=3), id="mha-hd64"),
])
def test_other_shapes_match_hf(tmp_path, hf_ref, kw):
    path = write_tiny_llama(tmp_path / "m", **kw)
    prompts = tiny_prompts(6, seed=1)
    outs = engine(path, max_num_batched_tokens=32).generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == refs(hf_ref, path, prompts)
