"""Greedy speculative decoding is exact: for every method the tokens are Hugging Face's (the
plain engine's), over batching, chunked prefill, preemption and prefix caching; stops and
max_tokens inside an accepted run end the request where plain decoding does; the K/V of
rejected drafts is never read (their slots are poisoned after every step)."""

from __future__ import annotations

import pytest

from inflight.engine import SamplingParams
from tests.engine.kv_slots import unread_slots
from tests.engine.spec.conftest import GREEDY, N, drain, make, methods, spec_prompts

POISON = 1.0e4  # finite: a masked read of it weighs nothing, a real read wrecks the output


def poison_unread_slots(eng) -> None:
    """Overwrite every KV slot (target and draft caches) that holds no computed token of a
    running request and no cached prefix block: rejected drafts' slots, trimmed blocks,
    free blocks."""
    unread = unread_slots(eng)
    for k, v in eng.runner.kv_caches + (eng.runner.draft_kv_caches or []):
        k[unread] = POISON
        v[unread] = POISON


def run_poisoned(eng, prompts, params):
    for i, p in enumerate(prompts):
        eng.add_request(str(i), prompt_token_ids=p, params=params)
    finals = {}
    while eng.has_unfinished():
        for out in eng.step():
            if out.finished:
                finals[out.request_id] = out
        poison_unread_slots(eng)
    return [finals[str(i)] for i in range(len(prompts))]


@pytest.mark.parametrize("method", ["ngram", "draft", "self-draft", "suffix"])
def test_greedy_tokens_identical_over_batching_chunking_preemption_prefix_cache(
        tiny_model_path, draft_model_path, hf_ref, method):
    """One busy configuration: 10 requests at once, a 16-token budget (prompts prefill in
    chunks, drafts are cut to fit), blocks of 4 and too few of them (preemption), prefix
    caching on with prompts that share prefixes, and every free KV slot poisoned."""
    spec = methods(tiny_model_path, draft_model_path)[method]
    prompts = spec_prompts()
    eng = make(tiny_model_path, spec, num_kv_blocks=24, block_size=4, max_num_batched_tokens=16,
               max_num_seqs=6)
    outs = run_poisoned(eng, prompts, GREEDY)
    assert [o.token_ids for o in outs] == [hf_ref.greedy(tiny_model_path, p, N) for p in prompts]
    s = eng.stats()
    assert s["preemptions"] > 0 and s["prefix_cache_hit_tokens"] > 0 and s["kv_blocks_used"] == 0
    assert s["spec_decode_num_drafts"] > 0 and s["spec_decode_num_accepted_tokens"] > 0
    if method == "self-draft":  # the target drafting for itself: every draft is accepted
        assert s["spec_decode_acceptance_rate"] == 1.0
    if method == "suffix":
        assert eng.spec.proposer.cache.num_requests > 0


def test_poisoning_would_be_noticed(tiny_model_path, hf_ref):
    """The poison is strong enough: written over a slot that is read, tokens change."""
    prompt = spec_prompts(1)[0]
    eng = make(tiny_model_path, block_size=4)
    eng.add_request("a", prompt_token_ids=prompt, params=GREEDY)
    eng.step()
    req = eng.requests["a"]
    for k, v in eng.runner.kv_caches:
        k[req.block_ids[0], 1] = POISON
    assert drain(eng)["a"].token_ids != hf_ref.greedy(tiny_model_path, prompt, N)


def _stops(reference_tokens, reference_text):
    """Stops that fire inside the second verification's run of the self-drafting engine
    (k = 4: the prefill emits token 0, then each step tokens 5j+1 .. 5j+5)."""
    return [
        ("stop-token", dict(stop_token_ids=(reference_tokens[7],))),
        ("stop-string", dict(stop=(reference_text,))),
        ("max-tokens", dict(max_tokens=8)),
    ]


def test_stops_and_max_tokens_inside_an_accepted_run(tiny_model_path):
    """With the target as its own draft every verification accepts all 4 drafts, so a
    stop token, a stop string or max_tokens falls inside an accepted run: the request
    ends at exactly the token (and text) plain decoding ends at."""
    spec = methods(tiny_model_path, tiny_model_path)["self-draft"]
    prompts = spec_prompts(4)
    plain = make(tiny_model_path)
    ref = plain.generate(prompts, GREEDY)
    checked = 0
    for i, (p, r) in enumerate(zip(prompts, ref)):
        # a stop string spanning tokens 7..8 of the reference text
        head = plain.tokenizer.decode(r.token_ids[:7])
        text = plain.tokenizer.decode(r.token_ids[:9])[len(head):]
        if r.token_ids[7] in r.token_ids[:7] or not text.strip() or text in r.text[:len(head)]:
            continue
        for name, kw in _stops(r.token_ids, text):
            params = SamplingParams(temperature=0.0, ignore_eos=True, **{"max_tokens": N, **kw})
            want = plain.generate([p], params)[0]
            eng = make(tiny_model_path, spec)
            got = eng.generate([p], params)[0]
            assert (got.token_ids, got.text, got.finish_reason) == \
                (want.token_ids, want.text, want.finish_reason), (i, name)
            assert want.finish_reason == ("length" if name == "max-tokens" else "stop")
            assert len(want.token_ids) in (8, 9) or name == "stop-string", (i, name)
            assert eng.stats()["spec_decode_num_accepted_tokens"] >= 4  # a full run before it
        checked += 1
    assert checked >= 2


@pytest.mark.parametrize("mode", [dict(cuda_graphs=True, overlap_outputs=True),
                                  dict(overlap_outputs=True)], ids=["graphs+overlap", "overlap"])
def test_padded_and_overlapped_paths_with_speculation(tiny_model_path, hf_ref, mode):
    """Above disable_by_batch_size steps run overlapped (and padded) without drafts; at or
    below it they speculate and run synchronously, eagerly. Tokens stay HF's."""
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
            "disable_by_batch_size": 3}
    prompts = spec_prompts(8)
    eng = make(tiny_model_path, spec, block_size=4, max_num_seqs=6, **mode)
    outs = eng.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == [hf_ref.greedy(tiny_model_path, p, N) for p in prompts]
    assert eng.stats()["spec_decode_num_drafts"] > 0
    assert eng.runner.num_device_fed > 0              # some steps overlapped
    if mode.get("cuda_graphs"):
        assert eng.runner.graphs.num_eager > 0        # some decode steps ran padded


def test_logprobs_of_accepted_tokens_are_the_targets(tiny_model_path):
    spec = methods(tiny_model_path, tiny_model_path)["self-draft"]
    prompts = spec_prompts(3)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=2)
    want = make(tiny_model_path).generate(prompts, params)
    eng = make(tiny_model_path, spec)
    got = eng.generate(prompts, params)
    assert eng.stats()["spec_decode_num_accepted_tokens"] > 0
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids and len(g.logprobs) == len(w.logprobs) == 12
        for a, b in zip(g.logprobs, w.logprobs):
            assert a.token_id == b.token_id and a.rank == b.rank
            assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
            assert [t for t, _ in a.top] == [t for t, _ in b.top]


@pytest.mark.parametrize("scheme", ["w8", "w4"])
def test_quantized_target_and_draft(tiny_model_path, tmp_path, scheme):
    """A quantized target verifies drafts with its own quantized layers (1 + k rows), and a
    quantized copy of it drafts for it: tokens are the quantized target's plain ones."""
    from tests.quant_models import quantized

    q = quantized(tiny_model_path, tmp_path / scheme, scheme, group_size=32 if scheme == "w4" else None)
    prompts = spec_prompts(4)
    want = make(q).generate(prompts, GREEDY)
    for spec in (methods(q, q)["ngram"], methods(q, q)["self-draft"]):
        eng = make(q, spec)
        got = eng.generate(prompts, GREEDY)
        assert [o.token_ids for o in got] == [o.token_ids for o in want], spec["method"]
        assert eng.stats()["spec_decode_num_accepted_tokens"] > 0
