"""OpenAI's presence_penalty, frequency_penalty and logit_bias, and vLLM's
repetition_penalty, min_p, min_tokens, bad_words and allowed_token_ids, through the
official openai SDK on chat and text completions: the tokens are the engine's with the
same parameters."""

from __future__ import annotations

import pytest

from tests.api.test_chat import MESSAGES, sdk

pytestmark = [pytest.mark.broker]

CONTROLS = dict(presence_penalty=1.2, frequency_penalty=0.6, logit_bias={"7": 5.0, "50": -100})
EXTRA = dict(repetition_penalty=1.4, min_p=0.05, min_tokens=3, allowed_token_ids=list(range(5, 200)))


def engine_tokens(model, **kw):
    from inflight.engine import Engine, EngineConfig
    from inflight.engine import SamplingParams as EP

    engine = Engine(EngineConfig(model=str(model), num_kv_blocks=64, max_num_seqs=2))
    prompt = kw.pop("prompt", None)
    messages = None if prompt is not None else MESSAGES
    bias = {int(k): v for k, v in kw.pop("logit_bias", {}).items()}
    engine.add_request("ref", prompt=prompt, messages=messages,
                       params=EP(temperature=0.0, logit_bias=bias or None, **kw))
    while True:
        for out in engine.step():
            if out.finished:
                return out


def test_chat_and_completions_apply_the_controls(stack):
    key = stack.new_key()
    client = sdk(stack, key)
    chat = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=10,
                                          temperature=0, extra_body=EXTRA, **CONTROLS)
    ref = engine_tokens(stack.model, max_tokens=10, **CONTROLS, **EXTRA)
    assert chat.choices[0].message.content == ref.text
    assert chat.usage.completion_tokens == len(ref.token_ids)
    text = client.completions.create(model="tiny", prompt="one two three", max_tokens=8,
                                     temperature=0, extra_body=EXTRA, **CONTROLS)
    ref = engine_tokens(stack.model, prompt="one two three", max_tokens=8, **CONTROLS, **EXTRA)
    assert text.choices[0].text == ref.text
    # out of range: a 400 naming the parameter, with the range
    import openai

    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4,
                                       frequency_penalty=-3)
    assert "frequency_penalty" in str(err.value) and "greater than or equal to -2" in str(err.value)


def test_streamed_chat_logprobs_per_chunk(stack):
    """logprobs with stream: each chunk carries its tokens' entries (OpenAI's shape), and
    together they are the non-streamed answer's."""
    client = sdk(stack, stack.new_key())
    kw = dict(model="tiny", messages=MESSAGES, max_tokens=12, temperature=0, logprobs=True,
              top_logprobs=2)
    whole = client.chat.completions.create(**kw).choices[0]
    chunks = list(client.chat.completions.create(stream=True, **kw))
    entries = [e for c in chunks for ch in c.choices if ch.logprobs is not None
               for e in ch.logprobs.content]
    assert len(entries) == len(whole.logprobs.content) == whole_tokens(whole)
    assert [(e.token, e.logprob) for e in entries] == [
        (e.token, e.logprob) for e in whole.logprobs.content]
    assert all(len(e.top_logprobs) == 2 for e in entries)
    text = "".join(ch.delta.content or "" for c in chunks for ch in c.choices)
    assert text == whole.message.content


def whole_tokens(choice) -> int:
    return len(choice.logprobs.content)
