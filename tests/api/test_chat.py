"""POST /v1/chat/completions through the queue, driven by the official openai SDK."""

from __future__ import annotations

import openai
import pytest

from tests.api.test_requests import poll

pytestmark = [pytest.mark.broker]

MESSAGES = [{"role": "system", "content": "be brief"},
            {"role": "user", "content": "the quick brown fox"}]


def reference(model, messages, max_tokens: int):
    """The same chat run straight on the engine (greedy)."""
    from inflight.engine import Engine, EngineConfig
    from inflight.engine import SamplingParams as EP

    engine = Engine(EngineConfig(model=str(model), num_kv_blocks=64, max_num_seqs=2))
    engine.add_request("ref", messages=messages, params=EP(max_tokens=max_tokens, temperature=0.0))
    while True:
        for out in engine.step():
            if out.finished:
                return out


def sdk(stack, key) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.url + "/v1", api_key=key.token, max_retries=0,
                         timeout=60)


def test_chat_completion_matches_the_engine(stack):
    key = stack.new_key()
    client = sdk(stack, key)
    ref = reference(stack.model, MESSAGES, 10)
    done = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=10,
                                          temperature=0)
    assert done.object == "chat.completion" and done.model == "tiny"
    assert done.choices[0].message.role == "assistant"
    assert done.choices[0].message.content == ref.text
    assert done.choices[0].finish_reason == ("length" if ref.finish_reason == "length" else "stop")
    assert done.usage.completion_tokens == len(ref.token_ids)
    assert done.usage.total_tokens == done.usage.prompt_tokens + done.usage.completion_tokens
    # the completion is a request like any other: pollable by its id, by its key only
    rid = done.id.removeprefix("chatcmpl-")
    with stack.http(key) as http:  # the answer came off Kafka; the recorder may lag a little
        stored = poll(http, rid)
    assert stored["token_ids"] == ref.token_ids and stored["priority"] == 0
    with stack.http(stack.new_key("other")) as other:
        assert other.get(f"/v1/requests/{rid}").status_code == 404


def test_streamed_chat_completion(stack):
    key = stack.new_key()
    client = sdk(stack, key)
    ref = reference(stack.model, MESSAGES, 16)
    chunks = list(client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=16, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ref.text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] in ("stop", "length") and not any(finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(ref.token_ids)


def test_bad_chat_input_is_a_400(stack):
    client = sdk(stack, stack.new_key())
    long = [{"role": "user", "content": "fox " * 2000}]  # over the tiny model's context
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny", messages=long, max_tokens=4)
    assert err.value.code == "prompt_too_long"
    with pytest.raises(openai.BadRequestError) as err:  # chat streams them; text completions not
        client.completions.create(model="tiny", prompt="the quick", logprobs=1, stream=True)
    assert err.value.param == "logprobs"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=stack.url + "/v1", api_key="wrong", max_retries=0
                      ).chat.completions.create(model="tiny", messages=MESSAGES)


def test_logprobs(stack):
    key = stack.new_key()
    done = sdk(stack, key).chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=6,
                                                   temperature=0, logprobs=True, top_logprobs=2)
    content = done.choices[0].logprobs.content
    assert len(content) == done.usage.completion_tokens
    assert all(t.logprob <= 0 and len(t.top_logprobs) == 2 for t in content)
    # greedy: the chosen token is the most likely one
    assert all(t.top_logprobs[0].logprob == pytest.approx(t.logprob) for t in content)
    with stack.http(key) as http:
        stored = poll(http, done.id.removeprefix("chatcmpl-"))
    assert len(stored["logprobs"]["content"]) == len(content)
