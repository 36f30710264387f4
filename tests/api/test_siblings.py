"""`n` > 1 through the official openai SDK (api/follow.py `answer_siblings`): n choices,
each a sibling request with its own seed, usage counted as OpenAI does (the prompt once);
with stream, and best_of > 1, a 400 that says "not supported"."""

from __future__ import annotations

import openai
import pytest

from tests.api.test_chat import MESSAGES, reference, sdk

pytestmark = [pytest.mark.broker]


def seeded(model, prompt: str, seed: int, max_tokens: int):
    """The same text completion run straight on the engine at temperature 1 with `seed`."""
    from inflight.engine import Engine, EngineConfig
    from inflight.engine import SamplingParams as EP

    engine = Engine(EngineConfig(model=str(model), num_kv_blocks=64, max_num_seqs=2))
    engine.add_request("ref", prompt=prompt, params=EP(max_tokens=max_tokens, temperature=1.0,
                                                       seed=seed))
    for _ in range(100):
        for out in engine.step():
            if out.finished:
                return out
    raise AssertionError("the reference did not finish")


def test_n_choices(stack):
    client = sdk(stack, stack.new_key())
    ref = reference(stack.model, MESSAGES, 8)
    greedy = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8,
                                            temperature=0, n=4)
    assert [c.index for c in greedy.choices] == [0, 1, 2, 3]
    assert [c.message.content for c in greedy.choices] == [ref.text] * 4
    assert greedy.usage.prompt_tokens == len(ref.prompt_token_ids)
    assert greedy.usage.completion_tokens == 4 * len(ref.token_ids)
    assert greedy.usage.total_tokens == greedy.usage.prompt_tokens + greedy.usage.completion_tokens
    # sampled: sibling i samples with seed + i, as the engine alone does with that seed
    sampled = client.completions.create(model="tiny", prompt="one two three", max_tokens=6,
                                        temperature=1, seed=7, n=4)
    refs = [seeded(stack.model, "one two three", 7 + i, 6) for i in range(4)]
    assert [c.text for c in sampled.choices] == [r.text for r in refs]
    assert len({tuple(r.token_ids) for r in refs}) > 1  # distinct seeds, distinct samples
    assert sampled.usage.prompt_tokens == len(refs[0].prompt_token_ids)
    assert sampled.usage.completion_tokens == sum(len(r.token_ids) for r in refs)


def test_siblings_compute_the_prompt_once(stack):
    """The siblings share the parent's Kafka key, so one worker gets all four: the prompt's
    full blocks are computed once and hit by the other three (the worker engine's counters)."""
    engine = stack.service.worker.engine
    bs = engine.kv.block_size
    prefill, hits = engine.counters.prefill_tokens, engine.kv.num_hit_tokens
    out = sdk(stack, stack.new_key()).completions.create(
        model="tiny", prompt="siblings share a prompt " * 12, max_tokens=2, temperature=0, n=4)
    p = out.usage.prompt_tokens
    assert p > 4 * bs and len({c.text for c in out.choices}) == 1
    assert engine.counters.prefill_tokens - prefill <= p + 3 * bs  # not 4 * p
    assert engine.kv.num_hit_tokens - hits >= 3 * (p - bs)


def test_n_refusals(stack):
    client = sdk(stack, stack.new_key())
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, n=2,
                                       stream=True)
    assert "not supported" in str(err.value) and "without stream" in str(err.value)
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="tiny", prompt="hi", max_tokens=4, best_of=2)
    assert "best_of" in str(err.value) and "not supported" in str(err.value)
