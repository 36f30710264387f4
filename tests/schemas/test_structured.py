"""structured_outputs, tools and tool calls on the wire: what each path accepts, the errors
(field and code) for what it does not, and the tool-call readers (whole and streamed)."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inflight.schemas import SchemaError, decode_request, parse_batch_line
from inflight.schemas.anthropic_batch import anthropic_batch_request
from inflight.schemas.anthropic_tools import tool_use_blocks
from inflight.schemas.tool_stream import ToolCallStream
from inflight.schemas.tools import parse_tool_calls, render_tool_messages, tool_call_id
from inflight.store.rows import queued_row

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}},
         {"type": "function", "function": {"name": "noop"}}]
USER = [{"role": "user", "content": "hi"}]


def request(**fields):
    return decode_request(orjson.dumps({"request_id": "r1", "prompt": "hi", **fields}))


def refused(decode, *args, **kw) -> SchemaError:
    with pytest.raises(SchemaError) as err:
        decode(*args, **kw)
    return err.value


@pytest.mark.parametrize("so", [{"json": SCHEMA}, {"json": json.dumps(SCHEMA)}, {"json_object": True},
                                {"regex": "[0-9]+"}, {"choice": ["a", "b"]},
                                {"grammar": 'root ::= "x" | "y"'}, {"grammar": 'start: "x"'}])
def test_each_kind_is_accepted_and_stored(so):
    req = request(params={"structured_outputs": so})
    kind = next(iter(so))
    stored = queued_row(req)["params"]["structured_outputs"]
    assert list(stored) == [kind] and req.params.structured_outputs.kind == kind
    if kind == "json":
        assert stored["json"] == SCHEMA  # JSON text is kept as the object it is


@pytest.mark.parametrize("so, field, code", [
    ({"json": {"type": "strng"}}, "params.structured_outputs.json", "invalid_schema"),
    ({"regex": "a("}, "params.structured_outputs.regex", "invalid_schema"),
    ({"grammar": "root ::= undefined"}, "params.structured_outputs.grammar", "invalid_schema"),
    ({"choice": []}, "params.structured_outputs.choice", "invalid_request"),
    ({"json_object": False}, "params.structured_outputs.json_object", "invalid_request"),
    ({"regex": "a", "choice": ["a"]}, "params.structured_outputs.choice", "invalid_request"),
    ({"bogus": 1}, "params.structured_outputs.bogus", "invalid_request"),
    ({"structural_tag": {"structures": [{"begin": "x", "schema": {}}], "triggers": ["<t>"]}},
     "params.structured_outputs.structural_tag.structures.0.begin", "invalid_request")])
def test_bad_constraints_name_their_field_and_code(so, field, code):
    err = refused(request, params={"structured_outputs": so})
    assert (err.field, err.code) == (field, code), err.message
    assert field in err.message


def test_tools_become_the_constraint_and_round_trip():
    from inflight.schemas.requests import InferenceRequest

    req = decode_request(orjson.dumps({"request_id": "r1", "messages": USER, "tools": TOOLS,
                                       "tool_choice": "required", "parallel_tool_calls": False}))
    tag = req.params.structured_outputs.structural_tag
    assert tag["at_least_one"] and tag["stop_after_first"] and tag["triggers"] == ["<tool_call>"]
    assert [s["schema"] for s in tag["structures"]] == [SCHEMA, {"type": "object", "properties": {}}]
    again = InferenceRequest.model_validate(req.model_dump())  # what batch lines do
    assert again.params == req.params
    named = decode_request(orjson.dumps({"request_id": "r1", "messages": USER, "tools": TOOLS,
                                         "tool_choice": {"type": "function",
                                                         "function": {"name": "noop"}}}))
    assert len(named.params.structured_outputs.structural_tag["structures"]) == 1
    none = decode_request(orjson.dumps({"request_id": "r1", "messages": USER, "tools": TOOLS,
                                        "tool_choice": "none"}))
    assert none.params.structured_outputs is None
    stored = queued_row(req)["params"]
    assert stored["tools"][0]["function"]["name"] == "get_weather" and stored["tool_choice"] == "required"


@pytest.mark.parametrize("extra, field", [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"params": {"structured_outputs": {"json_object": True}}}, "params.structured_outputs"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools.0.function.name")])
def test_bad_tool_requests(extra, field):
    body = {"request_id": "r1", "messages": USER, "tools": TOOLS, **extra}
    assert refused(decode_request, orjson.dumps(body)).field == field
    assert refused(decode_request, orjson.dumps({"request_id": "r1", "prompt": "x", "tools": TOOLS})
                   ).field == "tools"
    bad = {"request_id": "r1", "messages": USER, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "strng"}}}]}
    err = refused(decode_request, orjson.dumps(bad))
    assert (err.field, err.code) == ("tools.0.function.parameters", "invalid_schema")


def _chat_line(**body):
    return orjson.dumps({"custom_id": "c1", "method": "POST", "url": "/v1/chat/completions",
                         "body": {"model": "m", "messages": USER, **body}})


def test_openai_lines_map_response_format_structured_outputs_and_tools():
    def so(**body):
        got = parse_batch_line(_chat_line(**body)).params.structured_outputs
        return got.to_dict() if got is not None else None

    js = {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}
    assert so(response_format=js) == {"json": SCHEMA}
    assert so(response_format={"type": "json_object"}) == {"json_object": True}
    assert so(response_format={"type": "text"}) is None
    assert so(structured_outputs={"regex": "a+"}) == {"regex": "a+"}
    assert so(guided_choice=["x", "y"]) == {"choice": ["x", "y"]}
    assert "structural_tag" in so(tools=TOOLS, tool_choice="auto")
    for body, field, code in [
            (dict(response_format={"type": "json_schema", "json_schema": {"name": "x",
                                   "schema": {"type": "nope"}}}),
             "body.response_format.json_schema.schema", "invalid_schema"),
            (dict(response_format={"type": "xml"}), "body.response_format", "invalid_request"),
            (dict(response_format={"type": "json_object"}, guided_regex="a"), "body.guided_regex",
             "invalid_request"),
            (dict(structured_outputs={"regex": "(("}), "body.structured_outputs.regex",
             "invalid_schema")]:
        err = refused(parse_batch_line, _chat_line(**body))
        assert (err.field, err.code) == (field, code), err.message
    completion = orjson.dumps({"custom_id": "c", "method": "POST", "url": "/v1/completions",
                               "body": {"model": "m", "prompt": "x", "tools": TOOLS}})
    assert refused(parse_batch_line, completion).field == "body.tools"


def test_anthropic_lines_map_tools_and_tool_turns():
    tools = [{"name": "get_weather", "description": "d", "input_schema": SCHEMA}]
    line = {"custom_id": "m", "params": {"model": "c", "max_tokens": 8, "tools": tools,
                                        "tool_choice": {"type": "any",
                                                        "disable_parallel_tool_use": True},
                                        "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1",
                                           "name": "get_weather", "input": {"a": 1}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": "sunny"}, {"type": "text", "text": "and?"}]}]}}
    req = anthropic_batch_request(line, orjson.dumps(line), request_id="r1")
    assert req.tool_choice == "required" and req.parallel_tool_calls is False
    assert req.tools[0].function.parameters == SCHEMA
    assert [m.role for m in req.messages] == ["user", "assistant", "tool", "user"]
    assert req.messages[1].tool_calls[0].function.name == "get_weather"
    assert req.messages[2].content == "sunny" and req.messages[2].tool_call_id == "toolu_1"
    line["params"]["tool_choice"] = {"type": "tool", "name": "nope"}
    err = refused(anthropic_batch_request, line, orjson.dumps(line), request_id="r1")
    assert err.field == "params.tool_choice"


ANSWER = ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"a": 1, "s": '
          '"x}\\"</tool_call>"}}\n</tool_call>\n<tool_call>\n{"name": "noop", "arguments": {}}\n'
          '</tool_call>')


def test_parse_tool_calls_and_their_blocks():
    content, calls = parse_tool_calls(ANSWER, "r1")
    assert content == "Let me look."
    assert [(c["id"], c["function"]["name"]) for c in calls] == [
        (tool_call_id("r1", 0), "get_weather"), (tool_call_id("r1", 1), "noop")]
    assert json.loads(calls[0]["function"]["arguments"]) == {"a": 1, "s": 'x}"</tool_call>'}
    # a block that never ends is a call the answer did not finish: dropped, not content
    assert parse_tool_calls("plain <tool_call> broken", "r1") == ("plain", [])
    # a complete block (closing tag and all) that does not parse is the model's text
    assert parse_tool_calls("a <tool_call>x</tool_call> b", "r1") == (
        "a <tool_call>x</tool_call> b", [])
    blocks = tool_use_blocks(calls)
    assert blocks[0]["type"] == "tool_use" and blocks[0]["input"]["a"] == 1


CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"a": 1}}\n</tool_call>'


@pytest.mark.parametrize("text, content, names", [
    # the two cases: a second call's closing tag cut, a lone call cut in its JSON
    (CALL + "\n" + CALL[:-5], None, ["get_weather", "get_weather"]),
    (CALL[:40], None, []),
    ("Let me look.\n" + CALL[:30], "Let me look.", []),
    ("Let me look.\n" + CALL + "\n<tool_", "Let me look.", ["get_weather"]),
    ("Let me look. <tool_ca", "Let me look.", []),
    ("Let me look.\n" + CALL + "\n" + CALL[:len("<tool_call>\n{")], "Let me look.", ["get_weather"]),
])
def test_a_call_cut_by_max_tokens_leaves_no_markup(text, content, names):
    """Whole and streamed: the text outside the calls has no `<tool_call>` / `</tool_`
    left of a cut call (issue 36); calls that came out whole still count."""
    got, calls = parse_tool_calls(text, "r1", cut=True)
    assert got == content and [c["function"]["name"] for c in calls] == names
    for step in (1, 3, 7, len(text)):
        stream = ToolCallStream("r1")
        deltas = [d for i in range(0, len(text), step) for d in stream.feed(text[i:i + step])]
        deltas += stream.finish(cut=True)
        streamed = "".join(d.get("content", "") for d in deltas)
        assert "<tool" not in streamed and "</" not in streamed
        assert (streamed.strip() or None) == content
        assert len({tc["index"] for d in deltas for tc in d.get("tool_calls", [])}) >= len(names)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([ANSWER, "no calls, < tool", '<tool_call>\n{"name": "noop", "arguments": {}}\n</tool_call>']),
       st.lists(st.integers(min_value=1, max_value=200), max_size=12))
def test_streamed_tool_calls_equal_the_parsed_ones(text, cuts):
    """However the answer is cut into deltas, the stream's content and calls are the
    parse's."""
    points = sorted({c % len(text) for c in cuts} - {0})
    parts = [text[a:b] for a, b in zip([0, *points], [*points, len(text)])]
    stream = ToolCallStream("r1")
    deltas = [d for p in parts for d in stream.feed(p)] + stream.finish()
    calls: dict[int, dict] = {}
    for d in deltas:
        for tc in d.get("tool_calls", []):
            c = calls.setdefault(tc["index"], {"id": None, "name": None, "arguments": ""})
            if "id" in tc:
                c["id"], c["name"] = tc["id"], tc["function"]["name"]
            c["arguments"] += tc["function"]["arguments"]
    content, want = parse_tool_calls(text, "r1")
    assert [calls[i] for i in sorted(calls)] == [
        {"id": w["id"], "name": w["function"]["name"], "arguments": w["function"]["arguments"]}
        for w in want]
    streamed = "".join(d.get("content", "") for d in deltas)
    assert (streamed.strip() or None) == (content.strip() if content else None)


def test_tool_turns_for_a_template_without_tools():
    msgs = [{"role": "system", "content": "be brief"}, *USER,
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "noop", "arguments": "{}"}}]},
            {"role": "tool", "content": "done", "tool_call_id": "c1"}]
    out = render_tool_messages(msgs, TOOLS, template_takes_tools=False)
    assert out[0]["role"] == "system" and "<tools>" in out[0]["content"] and "be brief" in out[0]["content"]
    assert out[2]["content"] == '<tool_call>\n{"name": "noop", "arguments": {}}\n</tool_call>'
    assert out[3] == {"role": "user", "content": "<tool_response>\ndone\n</tool_response>"}
    kept = render_tool_messages(msgs, TOOLS, template_takes_tools=True)
    assert kept[2]["tool_calls"][0]["function"]["arguments"] == {} and kept[3]["role"] == "tool"
