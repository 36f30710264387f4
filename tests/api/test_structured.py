"""Structured outputs over the whole path (API -> Kafka -> worker -> recorder -> SQLite or
Postgres), with the official SDKs, on the tiny random model (the mask alone keeps its output
valid): response_format json_schema / json_object, tools with every tool_choice, streamed
tool-call deltas, bad schemas, an OpenAI batch file and an Anthropic message batch."""

from __future__ import annotations

import json

from typing import Literal

import anthropic
import jsonschema
import openai
import orjson
import pytest
from pydantic import BaseModel, Field

from tests.api.test_batches import CHAT, jsonl, wait_batch
from tests.api.test_chat import sdk
from tests.api.test_message_batches import sdk as anthropic_sdk
from tests.api.test_message_batches import wait_ended
from tests.consumers.conftest import wait_rows

pytestmark = [pytest.mark.broker]

USER = [{"role": "user", "content": "hi"}]
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 6},
                         "age": {"type": "integer", "minimum": 0, "maximum": 99}}}
# small: the tools are written into the prompt, and the tiny model's context is 512 tokens
WEATHER = {"type": "object", "required": ["city"], "additionalProperties": False,
           "properties": {"city": {"enum": ["Oslo", "Rome"]}}}
TIME = {"type": "object", "required": ["tz"], "additionalProperties": False,
        "properties": {"tz": {"enum": ["UTC", "CET"]}}}
TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "time", "parameters": TIME}}]
SCHEMAS = {"weather": WEATHER, "time": TIME}


class Pick(BaseModel):  # the SDK's parse helpers make a strict JSON schema of it
    label: Literal["cat", "dog"]
    n: int = Field(ge=0, le=9)


def _valid_calls(calls) -> None:
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_")
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])


def test_response_format_json_schema_and_json_object(stack):
    client = sdk(stack, stack.new_key())
    done = client.chat.completions.create(
        model="tiny", messages=USER, max_tokens=60, temperature=0,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    choice = done.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), PERSON)
    anything = client.chat.completions.create(
        model="tiny", messages=USER, max_tokens=60, temperature=0.7, seed=1,
        response_format={"type": "json_object"})
    if anything.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(anything.choices[0].message.content), dict)
    else:
        assert anything.choices[0].message.content.startswith("{")
    # the SDK's own helper: a pydantic model as a strict json_schema, parsed back
    parsed = client.chat.completions.parse(model="tiny", messages=USER, max_tokens=40,
                                           temperature=0, response_format=Pick)
    assert isinstance(parsed.choices[0].message.parsed, Pick)
    # vLLM's own key rides along as an extra body field; the constraint is stored with the request
    picked = client.chat.completions.create(
        model="tiny", messages=USER, max_tokens=10, temperature=1.0, seed=3,
        extra_body={"structured_outputs": {"choice": ["cat", "dog"]}})
    assert picked.choices[0].message.content in ("cat", "dog")
    row = stack.store.get_request(picked.id.removeprefix("chatcmpl-"))
    assert row.params["structured_outputs"] == {"choice": ["cat", "dog"]}


def test_tool_choice_required_named_none_and_auto(stack):
    client = sdk(stack, stack.new_key())

    def ask(**kw):
        return client.chat.completions.create(**{"model": "tiny", "messages": USER,
                                                 "max_tokens": 80, "tools": TOOLS, **kw}).choices[0]

    required = ask(tool_choice="required", parallel_tool_calls=False, temperature=0)
    assert required.finish_reason == "tool_calls" and len(required.message.tool_calls) == 1
    _valid_calls(required.message.tool_calls)
    named = ask(tool_choice={"type": "function", "function": {"name": "time"}},
                temperature=1.0, seed=5)
    assert named.finish_reason == "tool_calls"
    assert [c.function.name for c in named.message.tool_calls] == ["time"]
    _valid_calls(named.message.tool_calls)
    none = ask(tool_choice="none", temperature=0, max_tokens=8)
    assert none.message.tool_calls is None and none.finish_reason in ("stop", "length")
    auto = ask(temperature=0, max_tokens=40)  # the model chooses: text, or calls that validate
    if auto.message.tool_calls:
        _valid_calls(auto.message.tool_calls)
    else:
        assert auto.finish_reason in ("stop", "length") and auto.message.content is not None
    # the calls are stored with the request, in OpenAI's shape
    rid = client.chat.completions.create(model="tiny", messages=USER, max_tokens=80, tools=TOOLS,
                                         tool_choice="required", parallel_tool_calls=False,
                                         temperature=0).id.removeprefix("chatcmpl-")
    with stack.http(stack.new_key()) as http:
        assert http.get(f"/v1/requests/{rid}").status_code == 404  # another owner
    row = wait_rows(stack.store, [rid])[rid]  # the recorder may lag the answer a little
    assert [c["function"]["name"] for c in row.tool_calls] == \
        [c.function.name for c in required.message.tool_calls]


def test_streamed_tool_call_deltas(stack):
    client = sdk(stack, stack.new_key())
    kw = dict(model="tiny", messages=USER, max_tokens=80, tools=TOOLS, tool_choice="required",
              parallel_tool_calls=False, temperature=0)
    whole = client.chat.completions.create(**kw).choices[0].message.tool_calls
    chunks = list(client.chat.completions.create(stream=True, **kw))
    calls: dict[int, dict] = {}
    for c in chunks:
        for d in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            got = calls.setdefault(d.index, {"name": None, "arguments": ""})
            if d.id is not None:
                assert d.type == "function" and got["name"] is None
                got["name"] = d.function.name
            got["arguments"] += d.function.arguments or ""
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "tool_calls" and not any(finishes[:-1])
    assert [(v["name"], v["arguments"]) for _, v in sorted(calls.items())] == \
        [(c.function.name, c.function.arguments) for c in whole]
    # the SDK's stream helper puts the deltas back together and parses a strict tool's arguments
    with client.chat.completions.stream(
            model="tiny", messages=USER, max_tokens=80, temperature=0, tool_choice="required",
            parallel_tool_calls=False, tools=[openai.pydantic_function_tool(Pick)]) as stream:
        final = stream.get_final_completion()
    (call,) = final.choices[0].message.tool_calls
    assert call.function.name == "Pick" and isinstance(call.function.parsed_arguments, Pick)


def test_bad_schemas_are_a_400_with_the_compilers_message(stack):
    client = sdk(stack, stack.new_key())
    bad = [dict(response_format={"type": "json_schema", "json_schema": {
               "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "strng"}}}}}),
           dict(extra_body={"structured_outputs": {"regex": "[a-"}}),
           dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {
               "type": "object", "properties": {"n": {"type": "integer", "minimum": "x"}}}}}])]
    for kw in bad:
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="tiny", messages=USER, max_tokens=4, **kw)
        assert err.value.code == "invalid_schema", err.value
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny", messages=USER, max_tokens=4, tools=TOOLS,
                                       tool_choice={"type": "function",
                                                    "function": {"name": "nope"}})
    assert "nope" in err.value.message


def test_an_openai_batch_file_with_response_format_and_tools(stack):
    client = sdk(stack, stack.new_key())

    def line(cid, **body):
        return {"custom_id": cid, "method": "POST", "url": CHAT, "body": {
            "model": "tiny", "messages": USER, "max_tokens": 80, "temperature": 0, **body}}

    upload = client.files.create(file=("s.jsonl", jsonl([
        line("schema", response_format={"type": "json_schema",
                                        "json_schema": {"name": "p", "schema": PERSON}}),
        line("call", tools=TOOLS, tool_choice="required", parallel_tool_calls=False)])),
        purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint=CHAT, completion_window="24h")
    done = wait_batch(client, batch.id)
    assert done.status == "completed" and done.request_counts.completed == 2
    out = {x["custom_id"]: x["response"]["body"]["choices"][0] for x in map(
        orjson.loads, client.files.content(done.output_file_id).text.splitlines())}
    jsonschema.validate(json.loads(out["schema"]["message"]["content"]), PERSON)
    assert out["call"]["finish_reason"] == "tool_calls"
    (call,) = out["call"]["message"]["tool_calls"]
    jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[call["function"]["name"]])
    # a bad schema is the line's validation error
    bad = client.files.create(file=("b.jsonl", jsonl([line("x", response_format={
        "type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "nope"}}})])),
        purpose="batch")
    failed = wait_batch(client, client.batches.create(input_file_id=bad.id, endpoint=CHAT,
                                                      completion_window="24h").id)
    assert failed.status == "failed" and "json_schema.schema" in failed.errors.data[0].message


def test_an_anthropic_message_batch_with_tools(stack):
    client = anthropic_sdk(stack, stack.new_key())
    tools = [{"name": "weather", "description": "the forecast", "input_schema": WEATHER}]
    made = client.messages.batches.create(requests=[
        {"custom_id": "any", "params": {"model": "tiny", "max_tokens": 80, "temperature": 0.0,
                                        "messages": USER, "tools": tools,
                                        "tool_choice": {"type": "any"}}},
        {"custom_id": "named", "params": {"model": "tiny", "max_tokens": 80, "temperature": 0.5,
                                          "messages": USER, "tools": tools,
                                          "tool_choice": {"type": "tool", "name": "weather"}}}])
    wait_ended(client, made.id)
    results = {r.custom_id: r.result for r in client.messages.batches.results(made.id)}
    for cid in ("any", "named"):
        msg = results[cid].message
        assert results[cid].type == "succeeded" and msg.stop_reason == "tool_use"
        uses = [b for b in msg.content if b.type == "tool_use"]
        assert uses and all(u.name == "weather" and u.id.startswith("toolu_") for u in uses)
        for u in uses:
            jsonschema.validate(u.input, WEATHER)
    with pytest.raises(anthropic.BadRequestError):
        client.messages.batches.create(requests=[{"custom_id": "bad", "params": {
            "model": "tiny", "max_tokens": 8, "messages": USER,
            "tools": [{"name": "f", "input_schema": {"type": "objct"}}]}}])


def test_client_submit_and_a_raw_kafka_request(stack):
    from inflight.producers import Client
    from inflight.producers.requests_client import build_request as _request

    client = Client(stack.settings, store=stack.store)
    try:
        rid = client.submit("hello", {"max_tokens": 30, "temperature": 0,
                                      "structured_outputs": {"json": PERSON}})
        res = client.wait(rid, timeout=60)
        assert res.finish_reason == "stop"
        jsonschema.validate(json.loads(res.text), PERSON)
        rid = client.submit(messages=USER, params={"max_tokens": 80, "temperature": 0},
                            tools=TOOLS, tool_choice={"type": "function",
                                                      "function": {"name": "weather"}})
        res = client.wait(rid, timeout=60)
        assert [c["function"]["name"] for c in res.tool_calls] == ["weather"]
        # any producer: a raw message whose schema the grammar engine refuses ends in an
        # invalid_schema error final (it never reaches the engine)
        raw = orjson.loads(orjson.dumps(_request("hi", {"max_tokens": 4}).model_dump(mode="json")))
        raw["params"]["structured_outputs"] = {"json": {"type": "integr"}}
        client.producer.send(stack.settings.topic_requests, key=raw["request_id"].encode(),
                             value=orjson.dumps(raw))
        client.flush()
        res = client.wait(raw["request_id"], timeout=60)
        assert res.status == "failed" and res.error_code == "invalid_schema"
        assert "integr" in res.error
    finally:
        client.close()


def test_post_requests_with_a_constraint_and_tools(stack):
    from tests.api.test_requests import poll

    with stack.http(stack.new_key()) as http:
        bad = http.post("/v1/requests", json={"prompt": "hi", "params": {
            "max_tokens": 4, "structured_outputs": {"json": {"type": "strng"}}}})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_schema"
        assert "strng" in bad.json()["error"]["message"]
        made = http.post("/v1/requests", json={
            "messages": USER, "params": {"max_tokens": 80, "temperature": 0.0}, "tools": TOOLS,
            "tool_choice": {"type": "function", "function": {"name": "time"}}})
        assert made.status_code == 202, made.text
        done = poll(http, made.json()["id"])
        assert done["status"] == "completed"
        assert [c["function"]["name"] for c in done["tool_calls"]] == ["time"]
        jsonschema.validate(json.loads(done["tool_calls"][0]["function"]["arguments"]), TIME)
