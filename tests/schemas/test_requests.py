"""decode_request: each kind of bad input is a SchemaError that names the field."""

from __future__ import annotations

import orjson
import pytest

from inflight.engine.sampling_params import seed_for
from inflight.schemas import (PRIORITY_INTERACTIVE, InferenceRequest, SamplingParams, SchemaError,
                     decode_request, encode)


def raw(**fields) -> bytes:
    base = {"request_id": "req-1", "prompt": "Hello"}
    base.update(fields)
    return orjson.dumps({k: v for k, v in base.items() if v is not ...})


def test_minimal_request_decodes_with_defaults():
    req = decode_request(raw())
    assert req.request_id == "req-1" and req.prompt == "Hello"
    # unseeded: the seed fixed from the request id (the same on every decode of it)
    assert req.params == SamplingParams(seed=seed_for("req-1"))
    assert decode_request(raw()).params.seed == seed_for("req-1") != seed_for("req-2")
    assert req.priority == PRIORITY_INTERACTIVE and req.schema_version == 1
    assert req.submitted_at > 0


def test_round_trip_with_all_inputs():
    for kind in ({"prompt": "x"}, {"messages": [{"role": "user", "content": "hi"}]},
                 {"prompt_token_ids": [1, 2, 3]}):
        req = InferenceRequest(request_id="r", params=SamplingParams(stop="END", seed=7),
                               batch_id="b-1", metadata={"a": [1, {"b": None}]}, **kind)
        assert decode_request(encode(req)) == req
    assert req.params.stop == ("END",) and req.params.seed == 7  # a given seed is kept


@pytest.mark.parametrize("data, field, words", [
    (b"not json", None, "not valid JSON"),
    (b"\xff\xfe", None, "not valid JSON"),
    (b"[1, 2]", None, "JSON object"),
    (b'"a string"', None, "JSON object"),
    (raw(prompt=""), "prompt", "at least 1 character"),
    (raw(prompt=7), "prompt", "valid string"),
    (raw(foo=1), "foo", "unknown field"),
    (raw(params={"max_tokens": -1}), "params.max_tokens", "greater than or equal to 1"),
    (raw(params={"max_tokens": 0}), "params.max_tokens", "greater than or equal to 1"),
    (raw(params={"max_tokens": 10**9}), "params.max_tokens", "less than or equal"),
    (raw(params={"max_tokens": "5"}), "params.max_tokens", "valid integer"),
    (raw(params={"max_tokens": 5.5}), "params.max_tokens", "valid integer"),
    (raw(params={"top_p": 0}), "params.top_p", "greater than 0"),
    (raw(params={"top_p": 1.5}), "params.top_p", "less than or equal to 1"),
    (raw(params={"temperature": -0.1}), "params.temperature", "greater than or equal to 0"),
    (raw(params={"top_k": -2}), "params.top_k", "greater than or equal to -1"),
    (raw(params={"stop": [""]}), "params.stop.0", "must be a string of 1..256 characters"),
    (raw(params={"stop_token_ids": [-1]}), "params.stop_token_ids.0", "must be a token id in [0,"),
    (raw(params={"ignore_eos": 1}), "params.ignore_eos", "valid boolean"),
    (raw(params={"beam_width": 4}), "params.beam_width", "unknown field"),
    (b'{"request_id": "r", "prompt": "x", "params": {"temperature": NaN}}',
     "params.temperature", "finite"),
    (b'{"request_id": "r", "prompt": "x", "params": {"top_p": Infinity}}', "params.top_p", "finite"),
    (b'{"request_id": "r", "prompt": "x", "metadata": {"k": [NaN]}}', "metadata.k.0", "finite"),
    (raw(prompt=...), "prompt", "exactly one"),
    (raw(messages=[{"role": "user", "content": "x"}]), "messages", "exactly one"),
    (raw(prompt=..., messages=[]), "messages", "at least 1 item"),
    (raw(prompt=..., messages=[{"role": "robot", "content": "x"}]), "messages.0.role", "'user'"),
    (raw(prompt=..., messages=[{"role": "user", "content": ""}]), "messages", "empty"),
    (raw(prompt=..., prompt_token_ids=[]), "prompt_token_ids", "at least 1 item"),
    (raw(request_id=""), "request_id", "letters, digits"),
    (raw(request_id="a b"), "request_id", "letters, digits"),
    (raw(request_id="x" * 129), "request_id", "letters, digits"),
    (raw(request_id=5), "request_id", "valid string"),
    (raw(priority=10**6), "priority", "less than or equal"),
    (raw(priority=True), "priority", "valid integer"),
    (raw(schema_version=2), "schema_version", "1"),
    (raw(submitted_at="yesterday"), "submitted_at", "valid number"),
    (raw(batch_id="../etc"), "batch_id", "letters, digits"),
])
def test_bad_input_names_the_field(data, field, words):
    with pytest.raises(SchemaError) as info:
        decode_request(data)
    err = info.value
    assert err.field == field, str(err)
    assert words in str(err), str(err)
    if field:
        assert field in str(err)
    assert err.raw == data


def test_request_id_is_salvaged_from_a_bad_message():
    with pytest.raises(SchemaError) as info:
        decode_request(raw(params={"top_p": 9}))
    assert info.value.request_id == "req-1"
    with pytest.raises(SchemaError) as info:
        decode_request(raw(request_id="bad id"))
    assert info.value.request_id is None


def test_oversize_prompt_is_rejected_against_the_limit():
    with pytest.raises(SchemaError) as info:
        decode_request(raw(prompt="x" * 101), max_prompt_chars=100)
    assert info.value.field == "prompt"
    assert "101 characters" in str(info.value) and "INFLIGHT_MAX_PROMPT_CHARS" in str(info.value)
    msgs = [{"role": "system", "content": "x" * 60}, {"role": "user", "content": "y" * 60}]
    with pytest.raises(SchemaError) as info:
        decode_request(raw(prompt=..., messages=msgs), max_prompt_chars=100)
    assert info.value.field == "messages"
    assert decode_request(raw(prompt="x" * 100), max_prompt_chars=100).prompt_chars == 100


def test_oversize_message_is_rejected_against_max_bytes():
    data = raw(prompt="x" * 2000)
    with pytest.raises(SchemaError) as info:
        decode_request(data, max_bytes=1000)
    assert info.value.field == "message" and "INFLIGHT_KAFKA_MAX_MESSAGE_BYTES" in str(info.value)
    assert info.value.request_id == "req-1" and info.value.raw == data


def test_str_and_memoryview_inputs_and_other_types():
    assert decode_request(raw().decode()).prompt == "Hello"
    assert decode_request(memoryview(raw())).prompt == "Hello"
    with pytest.raises(SchemaError):
        decode_request(None)  # type: ignore[arg-type]
    with pytest.raises(SchemaError):
        decode_request(b"[" * 5000 + b"]" * 5000)


def test_models_are_frozen_and_strict_in_python_too():
    req = InferenceRequest(request_id="r", prompt="x")
    with pytest.raises(Exception):
        req.prompt = "y"  # type: ignore[misc]
    with pytest.raises(ValueError):
        SamplingParams(temperature=float("nan"))
    assert SamplingParams(temperature=1).temperature == 1.0  # an int is a fine float
    assert SamplingParams(top_k=0).uses_top_k is False
    assert SamplingParams(top_k=-1).uses_top_k is False
    assert SamplingParams(top_k=5).uses_top_k is True
    assert SamplingParams(temperature=0).greedy


def test_schema_errors_carry_the_error_event_code():
    from inflight.schemas import ERR_INVALID_REQUEST, ERR_MESSAGE_TOO_LARGE, ERR_PROMPT_TOO_LONG

    def code(raw: bytes, **kw) -> str:
        with pytest.raises(SchemaError) as e:
            decode_request(raw, **kw)
        return e.value.code

    assert code(b"not json") == ERR_INVALID_REQUEST
    assert code(b'{"request_id": "a", "prompt": "x", "bogus": 1}') == ERR_INVALID_REQUEST
    assert code(b'{"request_id": "a", "prompt": "' + b"x" * 300 + b'"}', max_bytes=100) == ERR_MESSAGE_TOO_LARGE
    assert code(b'{"request_id": "a", "prompt": "' + b"x" * 300 + b'"}', max_prompt_chars=100) == ERR_PROMPT_TOO_LONG


def test_stream_flag_defaults_by_priority():
    assert decode_request(raw()).stream is None and decode_request(raw()).wants_stream
    assert not decode_request(raw(priority=10)).wants_stream          # batch: off by default
    assert decode_request(raw(priority=10, stream=True)).wants_stream
    assert not decode_request(raw(stream=False)).wants_stream
    with pytest.raises(SchemaError) as info:
        decode_request(raw(stream="yes"))
    assert info.value.field == "stream"
