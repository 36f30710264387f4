"""Batch JSONL lines: our own request lines and OpenAI Batch lines."""

from __future__ import annotations

import orjson
import pytest

from inflight.schemas import PRIORITY_BATCH, InferenceRequest, SchemaError, encode, parse_batch_line
from inflight.schemas.anthropic_batch import anthropic_batch_request


def openai(url="/v1/completions", custom_id="line-1", **body):
    body.setdefault("model", "smollm2")
    if url == "/v1/completions":
        body.setdefault("prompt", "Once upon a time")
    else:
        body.setdefault("messages", [{"role": "user", "content": "hi"}])
    return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def test_openai_completion_line():
    req = parse_batch_line(openai(max_tokens=8, temperature=0, top_p=0.9, stop=["\n"], seed=3,
                                  n=1, stream=False, user="u"), batch_id="b1")
    assert req.request_id == "line-1" and req.prompt == "Once upon a time"
    assert req.batch_id == "b1" and req.priority == PRIORITY_BATCH
    p = req.params
    assert (p.max_tokens, p.temperature, p.top_p, p.stop, p.seed) == (8, 0.0, 0.9, ("\n",), 3)


def test_openai_chat_line_with_content_parts():
    msgs = [{"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    req = parse_batch_line(openai("/v1/chat/completions", messages=msgs, max_completion_tokens=4))
    assert [m.content for m in req.messages] == ["be brief", "ab"]
    assert req.params.max_tokens == 4


def test_openai_sampling_controls_reach_the_params():
    p = parse_batch_line(openai(presence_penalty=0.5, frequency_penalty=-1.0, logit_bias={"3": -100},
                                repetition_penalty=1.2, min_p=0.1, min_tokens=2, bad_words=["x"],
                                allowed_token_ids=[1, 2])).params
    assert (p.presence_penalty, p.frequency_penalty, p.logit_bias, p.repetition_penalty, p.min_p,
            p.min_tokens, p.bad_words, p.allowed_token_ids) == (
        0.5, -1.0, {3: -100.0}, 1.2, 0.1, 2, ("x",), (1, 2))


def test_openai_token_id_prompt():
    assert parse_batch_line(openai(prompt=[1, 2, 3])).prompt_token_ids == [1, 2, 3]
    assert parse_batch_line(openai(prompt=["one"])).prompt == "one"


@pytest.mark.parametrize("line, field, words", [
    (openai(n=2), "body.n", "not supported in a batch line"),
    (openai(stream=True), "body.stream", "not supported"),
    (openai(presence_penalty=2.5), "body.presence_penalty", "less than or equal to 2"),
    (openai(logit_bias={"12": 500}), "body.logit_bias.12", "[-100, 100]"),
    (openai(min_tokens=10, max_tokens=5), "body.min_tokens", "more than max_tokens"),
    (openai(frobnicate=1), "body.frobnicate", "frobnicate"),
    (openai(top_p=0), "body.top_p", "greater than 0"),
    (openai(max_tokens=-5), "body.max_tokens", "greater than or equal to 1"),
    (openai(temperature="hot"), "body.temperature", "valid number"),
    (openai(prompt=""), "body.prompt", "at least 1 character"),
    (openai(prompt=["a", "b"]), "body.prompt", "one prompt per line"),
    (openai("/v1/chat/completions", prompt="x"), "body.prompt", "messages"),
    (openai(messages=[]), "body.messages", "takes 'prompt'"),
    (openai("/v1/chat/completions", messages=[{"role": "user", "content": [{"type": "image_url"}]}]),
     "body.messages.0.content", "text parts"),
    (openai(custom_id="has space"), "custom_id", "letters, digits"),
    (openai(url="/v1/moderations"), "url", "/v1/embeddings"),
    (orjson.dumps({"custom_id": "c", "method": "GET", "url": "/v1/completions",
                   "body": {"prompt": "x"}}), "method", "POST"),
    (orjson.dumps({"custom_id": "c", "method": "POST", "url": "/v1/completions", "body": "x"}),
     "body", "object"),
    (orjson.dumps({"custom_id": "c", "url": "/v1/completions", "body": {"prompt": "x"},
                   "extra": 1}), "extra", "unknown"),
])
def test_bad_openai_lines_name_the_field(line, field, words):
    with pytest.raises(SchemaError) as info:
        parse_batch_line(line, line_no=7)
    err = info.value
    assert err.field == field, str(err)
    assert words in str(err) and str(err).startswith("line 7: ")


def test_custom_id_is_salvaged_on_error():
    with pytest.raises(SchemaError) as info:
        parse_batch_line(openai(custom_id="keep-me", temperature=-1))
    assert info.value.request_id == "keep-me"


def test_an_over_long_prompt_keeps_its_code_in_both_batch_formats():
    """Each format names its own field path; the code (prompt_too_long) survives the rename."""
    with pytest.raises(SchemaError) as info:
        parse_batch_line(openai(prompt="x" * 50), line_no=3, max_prompt_chars=10)
    assert (info.value.field, info.value.code) == ("body.prompt", "prompt_too_long")
    assert str(info.value).startswith("line 3: body.prompt: ")
    line = {"custom_id": "q1", "params": {"max_tokens": 4, "stop_sequences": ["a"],
                                          "messages": [{"role": "user", "content": "x" * 50}]}}
    with pytest.raises(SchemaError) as info:
        anthropic_batch_request(line, orjson.dumps(line), request_id="b:q1", max_prompt_chars=10)
    assert (info.value.field, info.value.code) == ("params.messages", "prompt_too_long")
    assert info.value.request_id == "b:q1"


def test_own_request_lines():
    got = parse_batch_line(b'{"request_id": "own-1", "prompt": "x"}', batch_id="b2")
    assert got.batch_id == "b2" and got.priority == PRIORITY_BATCH
    req = InferenceRequest(request_id="own-2", prompt="x", batch_id="b0")
    assert parse_batch_line(encode(req), batch_id="b2") == req  # explicit fields win
    assert parse_batch_line(orjson.dumps({"request_id": "r", "prompt": "x", "priority": -3}),
                            batch_id="b").priority == -3
    assert parse_batch_line(b'{"request_id": "r", "prompt": "x", "model": "m"}').model == "m"
    with pytest.raises(SchemaError) as info:  # a model id is visible ASCII without spaces
        parse_batch_line(b'{"request_id": "r", "prompt": "x", "model": "m 2"}')
    assert info.value.field == "model"
    with pytest.raises(SchemaError):
        parse_batch_line(b"{}", batch_id="bad id")
