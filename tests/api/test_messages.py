"""POST /v1/messages and /v1/messages/count_tokens (Anthropic's Messages API) through the
queue, driven by the official anthropic SDK and by instructor, against the real API,
broker, worker (the tiny random Llama) and recorder."""

from __future__ import annotations

from typing import Literal

import anthropic
import instructor
import jsonschema
import pytest
from pydantic import BaseModel

from tests.api.test_chat import reference
from tests.api.test_message_batches import sdk
from tests.api.test_requests import poll
from tests.api.test_structured import WEATHER

pytestmark = [pytest.mark.broker]

SYSTEM = "be brief"
USER = [{"role": "user", "content": "the quick brown fox"}]
CHAT = [{"role": "system", "content": SYSTEM}, *USER]
GREEDY = {"temperature": 0.0}   # this SDK sends sampling controls as extra body fields
TOOLS = [{"name": "weather", "description": "the forecast", "input_schema": WEATHER}]


def test_messages_create_matches_the_engine(stack):
    key = stack.new_key()
    client = sdk(stack, key)
    ref = reference(stack.model, CHAT, 10)
    msg = client.messages.create(model="tiny", max_tokens=10, system=SYSTEM, messages=USER,
                                 metadata={"user_id": "u1"}, extra_body=GREEDY)
    assert msg.type == "message" and msg.role == "assistant" and msg.model == "tiny"
    assert msg.id.startswith("msg_")
    assert [b.type for b in msg.content] == ["text"] and msg.content[0].text == ref.text
    assert msg.stop_reason == ("max_tokens" if ref.finish_reason == "length" else "end_turn")
    assert msg.stop_sequence is None
    assert msg.usage.output_tokens == len(ref.token_ids) and msg.usage.input_tokens > 0
    with stack.http(key) as http:  # a request like any other: pollable by its id
        stored = poll(http, msg.id.removeprefix("msg_"))
    assert stored["token_ids"] == ref.token_ids and stored["priority"] == 0
    # system as text blocks, and a multi-turn conversation, are the same prompt as chat's
    turns = [*USER, {"role": "assistant", "content": [{"type": "text", "text": "a"}]},
             {"role": "user", "content": [{"type": "text", "text": "b"}]}]
    ref = reference(stack.model, [CHAT[0], *USER, {"role": "assistant", "content": "a"},
                                  {"role": "user", "content": "b"}], 6)
    msg = client.messages.create(model="tiny", max_tokens=6, messages=turns, extra_body=GREEDY,
                                 system=[{"type": "text", "text": SYSTEM}])
    assert msg.content[0].text == ref.text


def test_stop_sequences_answer_stop_sequence(stack):
    client = sdk(stack, stack.new_key())
    full = reference(stack.model, CHAT, 16).text
    stop = full[len(full) // 2:len(full) // 2 + 3]
    assert stop.strip()
    msg = client.messages.create(model="tiny", max_tokens=16, system=SYSTEM, messages=USER,
                                 stop_sequences=[stop, "\x00never"], extra_body=GREEDY)
    assert (msg.stop_reason, msg.stop_sequence) == ("stop_sequence", stop)
    assert msg.content[0].text == full[:full.index(stop)]


def test_messages_stream_accumulates_the_final_message(stack):
    client = sdk(stack, stack.new_key())
    ref = reference(stack.model, CHAT, 12)
    kw = dict(model="tiny", max_tokens=12, system=SYSTEM, messages=USER, extra_body=GREEDY)
    with client.messages.stream(**kw) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == ref.text == final.content[0].text
    assert final.usage.output_tokens == len(ref.token_ids) and final.usage.input_tokens > 0
    assert final.stop_reason in ("end_turn", "max_tokens")
    # the raw events, in Anthropic's order
    kinds = [e.type for e in client.messages.create(stream=True, **kw)]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    body = [k for k in kinds[1:-2] if k != "ping"]
    assert body[0] == "content_block_start" and body[-1] == "content_block_stop"
    assert set(body[1:-1]) == {"content_block_delta"}


def test_a_tool_use_round_trip(stack):
    client = sdk(stack, stack.new_key())
    first = client.messages.create(model="tiny", max_tokens=80, messages=USER, tools=TOOLS,
                                   tool_choice={"type": "tool", "name": "weather"},
                                   extra_body=GREEDY)
    assert first.stop_reason == "tool_use"
    (use,) = [b for b in first.content if b.type == "tool_use"]
    assert use.name == "weather" and use.id.startswith("toolu_")
    jsonschema.validate(use.input, WEATHER)
    assert not any("<tool" in b.text for b in first.content if b.type == "text")
    # the answer goes back as the assistant turn, the result as a tool_result block
    second = client.messages.create(
        model="tiny", max_tokens=8, tools=TOOLS, tool_choice={"type": "none"},
        messages=[*USER, {"role": "assistant", "content": first.content},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                "content": "sunny"}]}], extra_body=GREEDY)
    assert second.stop_reason in ("end_turn", "max_tokens")
    assert [b.type for b in second.content] == ["text"]
    # streamed: the helper puts the tool_use block's input back together
    kw = dict(model="tiny", max_tokens=80, messages=USER, tools=TOOLS, extra_body=GREEDY,
              tool_choice={"type": "any", "disable_parallel_tool_use": True})
    with client.messages.stream(**kw) as stream:
        final = stream.get_final_message()
    (use,) = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use"
    jsonschema.validate(use.input, WEATHER)
    whole = client.messages.create(**kw)
    assert ([b.model_dump(exclude={"id"}) for b in whole.content]  # ids: per request
            == [b.model_dump(exclude={"id"}) for b in final.content])


def test_count_tokens_is_the_prompt_a_message_runs(stack):
    client = sdk(stack, stack.new_key())
    for kw in (dict(system=SYSTEM, messages=USER),
               dict(messages=USER, tools=TOOLS, tool_choice={"type": "any"})):
        counted = client.messages.count_tokens(model="tiny", **kw)
        ran = client.messages.create(model="tiny", max_tokens=1, extra_body=GREEDY, **kw)
        assert counted.input_tokens == ran.usage.input_tokens > 0
    assert (client.messages.count_tokens(model="tiny", messages=USER).input_tokens
            < client.messages.count_tokens(model="tiny", system=SYSTEM, messages=USER).input_tokens)


def test_errors_in_anthropics_shape(stack):
    key = stack.new_key()
    client = sdk(stack, key)
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model="tiny", max_tokens=8, messages=USER,
                               thinking={"type": "enabled", "budget_tokens": 1024})
    assert "thinking" in err.value.message
    assert err.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError) as err:   # a prefill
        client.messages.create(model="tiny", max_tokens=8,
                               messages=[*USER, {"role": "assistant", "content": "The"}])
    assert "messages.1" in err.value.message
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model="tiny", max_tokens=8, messages=USER,
                               extra_body={"temperature": "hot"})
    assert "temperature" in err.value.message
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model="tiny", max_tokens=8, messages=USER, tools=TOOLS,
                               tool_choice={"type": "tool", "name": "nope"})
    assert "tool_choice" in err.value.message
    with pytest.raises(anthropic.BadRequestError) as err:  # over the tiny model's context
        client.messages.create(model="tiny", max_tokens=8,
                               messages=[{"role": "user", "content": "fox " * 2000}])
    assert "context" in err.value.message or "tokens" in err.value.message
    with pytest.raises(anthropic.NotFoundError) as err:
        client.messages.create(model="claude-opus-4-1", max_tokens=8, messages=USER)
    assert err.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.AuthenticationError) as err:
        anthropic.Anthropic(base_url=stack.url, api_key="wrong", max_retries=0).messages.create(
            model="tiny", max_tokens=8, messages=USER)
    assert err.value.body["type"] == "error"
    with stack.http() as http:  # the raw shape, with the SDK's headers
        resp = http.post("/v1/messages", json={"model": "tiny", "messages": USER},
                         headers={"x-api-key": key.token, "anthropic-version": "2023-06-01"})
    assert resp.status_code == 400
    assert resp.json() == {"type": "error", "error": {
        "type": "invalid_request_error", "message": "missing required parameter 'max_tokens'"}}


class Forecast(BaseModel):  # small: instructor writes its schema into the prompt
    city: Literal["Oslo", "Rome"]


def test_instructor_anthropic_tools_and_json_modes(queued):
    client = sdk(queued, queued.new_key())
    kw = dict(model="tiny", max_tokens=80, max_retries=0, extra_body=GREEDY, messages=USER)
    tools = instructor.from_anthropic(client, mode=instructor.Mode.ANTHROPIC_TOOLS)
    got = tools.messages.create(response_model=Forecast, **kw)
    assert isinstance(got, Forecast)
    # JSON mode asks in the system prompt; the tiny random model cannot follow it, so the
    # answer is held to the schema with the Messages API's output_config
    fmt = {"format": {"type": "json_schema", "schema": Forecast.model_json_schema()}}
    json_mode = instructor.from_anthropic(client, mode=instructor.Mode.ANTHROPIC_JSON)
    got = json_mode.messages.create(response_model=Forecast, output_config=fmt, **kw)
    assert isinstance(got, Forecast)
