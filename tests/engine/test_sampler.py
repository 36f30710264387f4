"""Sampler: filters, seeds, stop strings, incremental detokenization."""

from __future__ import annotations

import pytest
import torch

from inflight.engine import Engine, EngineConfig, SamplingParams
from inflight.engine.detokenizer import IncrementalDetokenizer
from inflight.engine.sampler import SamplingBatch, sample
from inflight.engine.tokenizer import Tokenizer


def batch(S, temperature=1.0, top_k=None, top_p=None, gens=None):
    return SamplingBatch(torch.full((S,), temperature), top_k, top_p, gens or [None] * S, False)


def test_top_k_never_emits_filtered_token():
    torch.manual_seed(0)
    logits = torch.randn(4, 50) * 3
    k = torch.tensor([1, 3, 5, 50])
    allowed = [set(logits[i].topk(int(k[i])).indices.tolist()) for i in range(4)]
    gen = torch.Generator().manual_seed(1)
    for _ in range(300):
        toks = sample(logits, batch(4, 2.0, top_k=k), gen).tolist()
        assert all(t in allowed[i] for i, t in enumerate(toks))


def test_top_p_never_emits_filtered_token():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.05, 0.15, 0.3, 0.5]])
    logits = probs.log()
    gen = torch.Generator().manual_seed(2)
    seen = [set(), set()]
    for _ in range(500):
        toks = sample(logits, batch(2, 1.0, top_p=torch.tensor([0.7, 0.7])), gen).tolist()
        seen[0].add(toks[0])
        seen[1].add(toks[1])
    assert seen == [{0, 1}, {3, 2}]  # 0.5 + 0.3 >= 0.7: the tail is cut


def test_greedy_rows_in_mixed_batch_take_argmax():
    logits = torch.randn(3, 20)
    b = SamplingBatch(torch.tensor([0.0, 1.0, 0.0]), None, None, [None] * 3, False)
    toks = sample(logits, b, torch.Generator().manual_seed(0))
    assert toks[0] == logits[0].argmax() and toks[2] == logits[2].argmax()


@pytest.fixture(scope="module")
def eng(tiny_model_path):
    return Engine(EngineConfig(model=tiny_model_path, num_kv_blocks=256, debug_checks=True))


def test_seed_reproducible_across_batch_compositions(eng, prompts):
    seeded = SamplingParams(max_tokens=12, temperature=1.0, top_k=40, seed=1234, ignore_eos=True)
    alone = eng.generate([prompts[0]], seeded)[0].token_ids
    others = [SamplingParams(max_tokens=9, temperature=0.8, top_p=0.9, ignore_eos=True),
              SamplingParams(max_tokens=15, temperature=1.2, seed=7, ignore_eos=True),
              SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)]
    mixed = eng.generate([prompts[3], prompts[0], prompts[5], prompts[1]],
                         [others[0], seeded, others[1], others[2]])
    assert mixed[1].token_ids == alone
    other_seed = SamplingParams(max_tokens=12, temperature=1.0, top_k=40, seed=99, ignore_eos=True)
    assert eng.generate([prompts[0]], other_seed)[0].token_ids != alone


def test_stop_token_ids_and_max_tokens(eng, prompts):
    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    full = eng.generate([prompts[2]], greedy)[0]
    assert full.finish_reason == "length" and len(full.token_ids) == 12
    stop_tok = full.token_ids[4]
    out = eng.generate([prompts[2]], SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True,
                                                    stop_token_ids=(stop_tok,)))[0]
    cut = full.token_ids.index(stop_tok) + 1
    assert out.finish_reason == "stop" and out.token_ids == full.token_ids[:cut]


def test_stop_string_across_tokens_is_not_emitted(tiny_model_path):
    tok = Tokenizer(tiny_model_path)
    text = "the quick brown fox jumps over the lazy dog"
    ids = tok.encode(text)
    assert len(ids) > 4
    detok = IncrementalDetokenizer(tok, [], stop=["ck bro"])
    deltas, stopped = [], False
    for t in ids:
        stopped = detok.add_token(t)
        deltas.append(detok.take_delta(final=stopped))
        if stopped:
            break
    assert stopped and detok.stop_hit == "ck bro"
    assert "".join(deltas) == detok.text == "the qui"
    assert all("b" not in d for d in deltas)


def test_stop_string_in_engine_output(eng, prompts):
    greedy = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    full = eng.generate([prompts[7]], greedy)[0]
    text = full.text
    stop = text[len(text) // 2: len(text) // 2 + 3]
    assert stop
    out = eng.generate([prompts[7]], SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True,
                                                    stop=[stop]))[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop  # which stop string
    assert out.text == text[:text.index(stop)]
    assert full.stop_reason is None


def test_incremental_detokenization_streams_whole_characters(tiny_model_path):
    tok = Tokenizer(tiny_model_path)
    text = "ünïcödé wörds and emoji 🙂 live here too 🙂"
    ids = tok.encode(text)
    assert len(ids) > len(text.split())  # multi-byte characters span several tokens
    detok = IncrementalDetokenizer(tok, tok.encode("hello"))
    deltas = []
    for t in ids:
        detok.add_token(t)
        deltas.append(detok.take_delta(final=False))
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == text
