"""Property tests: every model round-trips; no input makes a decoder raise anything but
SchemaError."""

from __future__ import annotations

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from inflight.schemas import (ChatMessage, ErrorEvent, FinalEvent, InferenceRequest, SamplingParams,
                     SchemaError, Timings, TokenEvent, Usage, decode_request, decode_result,
                     encode, parse_batch_line)
from inflight.schemas.params import WireSamplingParams

FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

ids = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._:\-]{0,40}\Z")
tokens = st.lists(st.integers(0, 2**31 - 1), max_size=8)
finite = st.floats(allow_nan=False, allow_infinity=False)
stamps = st.none() | st.floats(0, 2e9)
json_leaf = st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | finite | st.text(max_size=10)
json_val = st.recursive(json_leaf, lambda c: st.lists(c, max_size=3)
                        | st.dictionaries(st.text(max_size=5), c, max_size=3), max_leaves=8)

params = st.builds(
    SamplingParams,
    max_tokens=st.integers(1, 131_072), temperature=st.floats(0, 100), top_p=st.floats(0.001, 1),
    top_k=st.integers(-1, 1000), seed=st.none() | st.integers(0, 2**63 - 1),
    stop=st.lists(st.text(min_size=1, max_size=5), max_size=3) | st.text(min_size=1, max_size=5),
    stop_token_ids=tokens, ignore_eos=st.booleans())
messages = st.lists(st.builds(ChatMessage, role=st.sampled_from(["system", "user", "assistant"]),
                              content=st.text(min_size=1, max_size=20)), min_size=1, max_size=3)


@st.composite
def requests(draw):
    kind = draw(st.sampled_from(["prompt", "messages", "prompt_token_ids"]))
    value = {"prompt": st.text(min_size=1, max_size=50), "messages": messages,
             "prompt_token_ids": st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=8)}[kind]
    return InferenceRequest(
        request_id=draw(ids), params=draw(params), priority=draw(st.integers(-1000, 1000)),
        batch_id=draw(st.none() | ids),
        metadata=draw(st.dictionaries(st.text(min_size=1, max_size=8), json_val, max_size=3)),
        submitted_at=draw(st.floats(0, 2e9)), **{kind: draw(value)})


events = st.one_of(
    st.builds(TokenEvent, request_id=ids, index=st.integers(0, 10**6), token_ids=tokens,
              text=st.text(max_size=20)),
    st.builds(FinalEvent, request_id=ids, text=st.text(max_size=20), token_ids=tokens,
              finish_reason=st.sampled_from(["stop", "length", "abort", "error"]),
              usage=st.builds(Usage, prompt_tokens=st.integers(0, 10**6),
                              completion_tokens=st.integers(0, 10**6),
                              cached_prompt_tokens=st.integers(0, 10**6)),
              timings=st.builds(Timings, submitted_at=stamps, queued_at=stamps,
                                scheduled_at=stamps, first_token_at=stamps, finished_at=stamps),
              worker=st.none() | st.text(max_size=10), batch_id=st.none() | ids),
    st.builds(ErrorEvent, request_id=st.none() | ids, code=st.from_regex(r"\A[a-z][a-z0-9_]{0,20}\Z"),
              message=st.text(max_size=30), field=st.none() | st.text(max_size=10)),
)


@FAST
@given(requests())
def test_request_round_trip(req):
    assert decode_request(encode(req), max_bytes=None, max_prompt_chars=None) == req


@FAST
@given(params)
def test_params_round_trip(p):
    assert TypeAdapter(WireSamplingParams).validate_json(orjson.dumps(p.to_dict())) == p


@FAST
@given(events)
def test_event_round_trip(event):
    back = decode_result(encode(event))
    assert back == event and type(back) is type(event)


def _only_schema_errors(fn, data):
    try:
        fn(data)
    except SchemaError as e:
        assert e.raw is not None
        assert str(e)


@FAST
@given(st.binary(max_size=200))
def test_random_bytes_only_raise_schema_error(data):
    _only_schema_errors(decode_request, data)
    _only_schema_errors(decode_result, data)
    _only_schema_errors(parse_batch_line, data)


# JSON-ish objects close to the real shapes, with wrong types and odd values mixed in
field_names = st.sampled_from(["request_id", "prompt", "messages", "prompt_token_ids", "params",
                               "priority", "batch_id", "metadata", "submitted_at", "type", "index",
                               "token_ids", "text", "finish_reason", "usage", "code", "message",
                               "custom_id", "method", "url", "body", "schema_version",
                               "max_tokens", "top_p", "stop", "role", "content", "zzz"])
odd = st.one_of(json_leaf, st.sampled_from(["", "POST", "/v1/completions", "/v1/chat/completions",
                                            "token", "final", "error", "user", "stop", 0, -1, 1]))
jsonish = st.recursive(odd, lambda c: st.lists(c, max_size=3)
                       | st.dictionaries(field_names, c, max_size=6), max_leaves=20)


@FAST
@given(st.dictionaries(field_names, jsonish, max_size=8))
def test_random_json_objects_only_raise_schema_error(obj):
    data = orjson.dumps(obj)
    _only_schema_errors(decode_request, data)
    _only_schema_errors(decode_result, data)
    _only_schema_errors(parse_batch_line, data)


@FAST
@given(requests(), st.sampled_from(["params", "prompt", "metadata", "priority", "request_id"]),
       jsonish)
def test_mutated_requests_only_raise_schema_error(req, key, value):
    obj = orjson.loads(encode(req))
    obj[key] = value
    _only_schema_errors(decode_request, orjson.dumps(obj))
