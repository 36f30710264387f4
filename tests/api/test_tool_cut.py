"""A tool call cut by max_tokens leaves no markup (issue 36): chat completions and
/v1/messages, whole and streamed, with the official SDKs against the real API and broker.
The test plays the worker (tests/api/test_chat_stream_text.FakeWorkers), so the answer is
exactly the cut one: two calls, the second's closing tag cut (`</tool_`), and a lone call
cut inside its JSON."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

from inflight.schemas import FinalEvent
from inflight.schemas.tools import parse_tool_calls
from tests.api.test_chat_stream_text import FakeWorkers, filed_request, reader, rest

pytestmark = [pytest.mark.broker]

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
CUTS = {"closing tag": (CALL + "\n" + CALL[:-5], 2),
        "arguments": ('<tool_call>\n{"name": "get_weather", "arguments": {"ci', 0)}
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
USER = [{"role": "user", "content": "weather in Paris?"}]


def finish(workers: FakeWorkers, rid: str, text: str) -> None:
    """The worker's events of an answer cut at max_tokens: deltas, then the final."""
    pieces = [text[i:i + 7] for i in range(0, len(text), 7)]
    workers.tokens(rid, "a1", [([i], p) for i, p in enumerate(pieces)])
    calls = parse_tool_calls(text, rid, cut=True)[1]
    workers._send(workers.settings.topic_results, FinalEvent(
        request_id=rid, attempt="a1", text=text, token_ids=list(range(len(pieces))),
        finish_reason="length", worker="w", tool_calls=calls or None))
    workers.producer.flush()


def answered(bare, workers, key, call, text):
    """What `call(put)` got from the API while the fake worker answered with `text`."""
    got = reader(call)
    finish(workers, filed_request(bare, key.info.owner), text)
    return rest(got)


@pytest.fixture
def workers(bare):
    w = FakeWorkers(bare.settings)
    yield w
    w.close()


def no_markup(text: str | None) -> bool:
    return not text or ("<tool" not in text and "</" not in text)


@pytest.mark.parametrize("cut", sorted(CUTS))
def test_chat_completions(bare, workers, cut):
    text, n_calls = CUTS[cut]
    key = bare.new_key()
    client = openai.OpenAI(base_url=bare.url + "/v1", api_key=key.token, max_retries=0,
                           timeout=60)
    kw = dict(model="default", messages=USER, max_tokens=20, tool_choice="required",
              tools=[{"type": "function", "function": {"name": "get_weather",
                                                       "parameters": SCHEMA}}])
    (whole,) = answered(bare, workers, key,
                        lambda put: put(client.chat.completions.create(**kw)), text)
    choice = whole.choices[0]
    assert choice.finish_reason == "length" and no_markup(choice.message.content)
    assert len(choice.message.tool_calls or []) == n_calls
    key = bare.new_key()
    client = openai.OpenAI(base_url=bare.url + "/v1", api_key=key.token, max_retries=0,
                           timeout=60)
    chunks = answered(bare, workers, key, lambda put: [
        put(c) for c in client.chat.completions.create(stream=True, **kw)], text)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert no_markup(content) and chunks[-1].choices[0].finish_reason == "length"
    streamed = {t.index for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []}
    assert len(streamed) >= n_calls   # a call cut in its JSON streams as far as it came


@pytest.mark.parametrize("cut", sorted(CUTS))
def test_messages(bare, workers, cut):
    text, n_calls = CUTS[cut]
    key = bare.new_key()
    client = anthropic.Anthropic(base_url=bare.url, api_key=key.token, max_retries=0, timeout=60)
    kw = dict(model="default", messages=USER, max_tokens=20, tool_choice={"type": "any"},
              tools=[{"name": "get_weather", "input_schema": SCHEMA}])
    (msg,) = answered(bare, workers, key, lambda put: put(client.messages.create(**kw)), text)
    assert msg.stop_reason == "max_tokens" and msg.stop_sequence is None
    assert [b.type for b in msg.content] == ["tool_use"] * n_calls
    assert all(b.input == {"city": "Paris"} for b in msg.content)
    key = bare.new_key()
    client = anthropic.Anthropic(base_url=bare.url, api_key=key.token, max_retries=0, timeout=60)

    def stream(put) -> None:
        with client.messages.stream(**kw) as s:
            put(s.get_final_message())

    (final,) = answered(bare, workers, key, stream, text)
    assert final.stop_reason == "max_tokens"
    assert all(no_markup(b.text) for b in final.content if b.type == "text")
    uses = [b for b in final.content if b.type == "tool_use"]
    assert [b.input for b in uses[:n_calls]] == [{"city": "Paris"}] * n_calls
    assert len(uses) - n_calls <= 1   # the cut call as far as it came, its input partial
    json.dumps([b.input for b in uses])
