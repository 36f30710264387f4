"""Penalties, logit bias, allowed tokens, bad words, min_tokens, min_p: token-exact at
temperature 0 against transformers' logits processors (and a reference of OpenAI's
presence/frequency formula) on the same tiny model, mixed in one batch; min_p against
MinPLogitsWarper on the same logits; and no effect on requests that do not use them."""

from __future__ import annotations

import pytest
import torch

from inflight.engine import Engine, EngineConfig, SamplingParams
from inflight.engine.logits_processors import apply_min_p

N = 10
EOS = 1  # tests/tiny_llama.py


class OpenAIPenalties:
    """OpenAI's definition: logit -= count * frequency + (count > 0) * presence, counts of
    the generated tokens only."""

    def __init__(self, prompt_len: int, presence: float, frequency: float):
        self.start, self.presence, self.frequency = prompt_len, presence, frequency

    def __call__(self, input_ids, scores):
        out = input_ids[:, self.start:]
        counts = torch.zeros_like(scores)
        counts.scatter_add_(1, out, torch.ones_like(out, dtype=scores.dtype))
        return scores - counts * self.frequency - (counts > 0) * self.presence


@pytest.fixture(scope="module")
def hf(tiny_model_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()


def hf_greedy(model, prompt, n, **kw):
    from transformers import LogitsProcessorList

    procs = kw.pop("logits_processor", None)
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False,
                             pad_token_id=0, eos_token_id=kw.pop("eos_token_id", None),
                             logits_processor=LogitsProcessorList(procs or []), **kw)
    return out[0, len(prompt):].tolist()


def cases(prompts, vocab):
    """(SamplingParams, transformers generate kwargs) pairs, one per prompt."""
    bad = 40
    allowed = list(range(20, 60))
    return [
        (dict(repetition_penalty=1.8), dict(repetition_penalty=1.8)),
        (dict(repetition_penalty=0.7), dict(repetition_penalty=0.7)),
        (dict(presence_penalty=1.5, frequency_penalty=0.8),
         dict(logits_processor=[OpenAIPenalties(len(prompts[2]), 1.5, 0.8)])),
        (dict(frequency_penalty=-0.5, presence_penalty=-1.0, repetition_penalty=1.3),
         dict(repetition_penalty=1.3, logits_processor=[OpenAIPenalties(len(prompts[3]), -1.0, -0.5)])),
        (dict(logit_bias={7: 6.0, 50: -100.0, 77: 3.5}),
         dict(sequence_bias={(7,): 6.0, (50,): -100.0, (77,): 3.5})),
        (dict(min_tokens=6, logit_bias={EOS: 100.0}, ignore_eos=False),
         dict(min_new_tokens=6, sequence_bias={(EOS,): 100.0}, eos_token_id=EOS)),
        (dict(allowed_token_ids=tuple(allowed)),
         dict(logits_processor=[_Allowed(allowed, vocab)])),
        (None, {}),  # a plain request in the same batch
    ], bad


class _Allowed:
    def __init__(self, ids, vocab):
        self.mask = torch.full((vocab,), float("-inf"))
        self.mask[ids] = 0.0

    def __call__(self, input_ids, scores):
        return scores + self.mask


@pytest.mark.parametrize("config", [
    {},
    # overlapped outputs (counts added on the device before the host reads the token),
    # chunked prefills (a mid-prompt chunk's sample is not counted), padded decode steps
    {"overlap_outputs": True, "max_num_batched_tokens": 24, "cuda_graphs": True},
], ids=["plain", "overlap-chunked-padded"])
def test_greedy_tokens_equal_transformers_processors(tiny_model_path, prompts, hf, config):
    eng = Engine(EngineConfig(model=tiny_model_path, num_kv_blocks=256, debug_checks=True, **config))
    vocab = eng.model.config.vocab_size
    table, _ = cases(prompts, vocab)
    params = [SamplingParams(max_tokens=N, temperature=0.0, ignore_eos=True, **(p or {}))
              if p is None or "ignore_eos" not in p else
              SamplingParams(max_tokens=N, temperature=0.0, **p) for p, _ in table]
    outs = eng.generate(prompts[:len(table)], params)
    for i, ((p, kw), out) in enumerate(zip(table, outs)):
        want = hf_greedy(hf, prompts[i], N, **kw)
        assert out.token_ids == want, (i, p)
    # the biased EOS ends the min_tokens request right after its minimum
    assert outs[5].finish_reason == "stop" and len(outs[5].token_ids) == 7
    assert all(20 <= t < 60 for t in outs[6].token_ids)
    # the processors changed something, and the plain row is what it is alone
    plain = eng.generate(prompts[:len(table)], SamplingParams(max_tokens=N, temperature=0.0,
                                                               ignore_eos=True))
    assert sum(a.token_ids != b.token_ids for a, b in zip(outs, plain)) >= 5
    assert outs[-1].token_ids == plain[-1].token_ids


def test_bad_words_are_never_emitted(tiny_model_path, prompts):
    eng = Engine(EngineConfig(model=tiny_model_path, num_kv_blocks=128))
    plain = eng.generate([prompts[0]], SamplingParams(max_tokens=N, temperature=0.0, ignore_eos=True))[0]
    word = eng.tokenizer.decode([plain.token_ids[0]])
    banned = eng.generate([prompts[0]], SamplingParams(max_tokens=N, temperature=0.0, ignore_eos=True,
                                                       bad_words=(word.strip() or word,)))[0]
    assert banned.finish_reason in ("length", "error")
    if banned.finish_reason == "length":
        assert plain.token_ids[0] not in banned.token_ids
    else:  # the word is several tokens with a leading space: refused, saying why
        assert "not supported" in banned.error


def test_min_p_equals_transformers_warper():
    from transformers import MinPLogitsWarper

    torch.manual_seed(0)
    logits = torch.randn(4, 300) * 3
    for p in (0.05, 0.2, 0.6):
        want = MinPLogitsWarper(min_p=p)(None, logits.clone())
        got = apply_min_p(logits, torch.full((4,), p))
        assert torch.equal(torch.isinf(got), torch.isinf(want))
        assert torch.equal(got[~torch.isinf(got)], logits[~torch.isinf(want)])


def test_sampled_penalties_follow_the_distribution(tiny_model_path, prompts):
    """Sampling with a strong presence penalty: a token once out is (almost) never sampled
    again, where without it the tiny model repeats."""
    eng = Engine(EngineConfig(model=tiny_model_path, num_kv_blocks=256))
    pen = SamplingParams(max_tokens=24, temperature=0.7, seed=11, ignore_eos=True, presence_penalty=2.0,
                         frequency_penalty=2.0, min_p=0.01)
    plain = SamplingParams(max_tokens=24, temperature=0.7, seed=11, ignore_eos=True)
    outs_pen = eng.generate(prompts[:6], pen)
    outs_plain = eng.generate(prompts[:6], plain)
    repeats = lambda outs: sum(len(o.token_ids) - len(set(o.token_ids)) for o in outs)
    assert repeats(outs_pen) < repeats(outs_plain)


def test_refusals_say_why(tiny_model_path, prompts):
    eng = Engine(EngineConfig(model=tiny_model_path, num_kv_blocks=64))
    out = eng.generate([prompts[0]], SamplingParams(max_tokens=4, logit_bias={10_000: 1.0}))[0]
    assert out.finish_reason == "error" and "vocabulary" in out.error
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(max_tokens=4, min_tokens=5)
    with pytest.raises(ValueError, match="presence_penalty"):
        SamplingParams(presence_penalty=2.5)


def test_with_speculative_decoding_processed_requests_do_not_speculate(tiny_model_path, prompts):
    """An n-gram speculating engine: a request with penalties gets the tokens of an engine
    without speculation (nothing speculates while it is live); one that forces
    speculation is refused, saying why."""
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
            "prompt_lookup_min": 1}
    eng = Engine(EngineConfig(model=tiny_model_path, num_kv_blocks=256, speculative_config=spec,
                              debug_checks=True))
    plain = Engine(EngineConfig(model=tiny_model_path, num_kv_blocks=256))
    greedy = SamplingParams(max_tokens=N, temperature=0.0, ignore_eos=True)
    pen = SamplingParams(max_tokens=N, temperature=0.0, ignore_eos=True, repetition_penalty=1.6,
                         frequency_penalty=0.5)
    got = eng.generate(prompts[:3], [greedy, pen, greedy])
    want = plain.generate(prompts[:3], [greedy, pen, greedy])
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    forced = eng.generate([prompts[0]], SamplingParams(max_tokens=4, min_p=0.1, speculative=True))[0]
    assert forced.finish_reason == "error" and "not supported with speculative decoding" in forced.error
