"""POST /v1/completions (the legacy text API) through the queue with the official openai
SDK: text and token-id prompts equal to a direct engine run, echo, logprobs of the prompt
and of the output (scoring a prompt as evaluation harnesses do), streaming; and the
served model and the attempts a request took, as clients read them."""

from __future__ import annotations

import math

import openai
import pytest

from tests.api.test_chat import sdk
from tests.api.test_requests import poll

pytestmark = [pytest.mark.broker]

PROMPT = "the quick brown fox"


def engine_run(model, prompt, max_tokens: int, **kw):
    from inflight.engine import Engine, EngineConfig
    from inflight.engine import SamplingParams as EP

    engine = Engine(EngineConfig(model=str(model), num_kv_blocks=64, max_num_seqs=2))
    (out,) = engine.generate([prompt], EP(max_tokens=max_tokens, temperature=0.0, **kw))
    return engine, out


def test_text_and_token_prompts_match_the_engine(stack):
    client = sdk(stack, stack.new_key())
    engine, ref = engine_run(stack.model, PROMPT, 8)
    done = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, temperature=0)
    assert (done.object, done.model) == ("text_completion", "tiny")
    assert done.choices[0].text == ref.text and done.usage.completion_tokens == len(ref.token_ids)
    ids = engine.tokenizer.encode(PROMPT)
    by_ids = client.completions.create(model="default", prompt=ids, max_tokens=8, temperature=0)
    assert by_ids.choices[0].text == ref.text and by_ids.model == "tiny"
    assert by_ids.usage.prompt_tokens == len(ids)
    streamed = list(client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8,
                                              temperature=0, stream=True,
                                              stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in streamed if c.choices) == ref.text
    assert streamed[-1].usage.completion_tokens == len(ref.token_ids)
    echoed = list(client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8,
                                            temperature=0, stream=True, echo=True))
    assert "".join(c.choices[0].text for c in echoed if c.choices) == PROMPT + ref.text


def test_echo_and_logprobs_score_the_prompt(stack):
    client = sdk(stack, stack.new_key())
    engine, ref = engine_run(stack.model, PROMPT, 1, prompt_logprobs=1)
    n_prompt = len(engine.tokenizer.encode(PROMPT))
    scored = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=0, echo=True,
                                       logprobs=1, temperature=0)
    choice = scored.choices[0]
    assert choice.text == PROMPT and scored.usage.completion_tokens == 0
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) == n_prompt
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    want = [e.logprob for e in ref.prompt_logprobs[1:]]
    assert lp.token_logprobs[1:] == pytest.approx(want, abs=1e-4)
    assert "".join(lp.tokens) == PROMPT and lp.text_offset[-1] == len(PROMPT) - len(lp.tokens[-1])
    # with output: the prompt's entries, then the output's, offsets into the whole text
    more = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4, echo=True,
                                     logprobs=2, temperature=0).choices[0]
    assert more.text.startswith(PROMPT) and len(more.logprobs.tokens) == n_prompt + 4
    toks = more.logprobs.tokens
    for i, (tok, off) in enumerate(zip(toks, more.logprobs.text_offset)):
        # a token with part of a character (a random model writes such) has no text of its own
        if not tok.startswith("bytes:") and not (i and toks[i - 1].startswith("bytes:")):
            assert more.text[off:off + len(tok)] == tok
    assert all(len(t) >= 2 for t in more.logprobs.top_logprobs[n_prompt:])
    assert all(v <= 0 and not math.isnan(v) for v in more.logprobs.token_logprobs[1:])
    assert choice.finish_reason == "length"


def test_the_served_model_and_attempts(stack):
    key = stack.new_key()
    client = sdk(stack, key)
    (model,) = client.models.list().data  # its worker announces it (the registry)
    assert model.id == "tiny" and model.max_model_len == 512  # the tiny model's context
    assert model.parent is None and client.models.retrieve("default").id == "tiny"
    done = client.chat.completions.create(model="default", max_tokens=3, temperature=0,
                                          messages=[{"role": "user", "content": "hi"}])
    assert done.model == "tiny"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", max_tokens=3,
                                       messages=[{"role": "user", "content": "hi"}])
    with stack.http(key) as http:
        stored = poll(http, done.id.removeprefix("chatcmpl-"))
    assert stored["status"] == "completed" and stored["attempts"] == 1  # the recorder counted it
    with pytest.raises(openai.BadRequestError) as err:  # the worker knows the vocabulary
        client.chat.completions.create(model="tiny", max_tokens=3,
                                       messages=[{"role": "user", "content": "hi"}],
                                       extra_body={"stop_token_ids": [10**6]})
    assert "vocabulary" in err.value.message
