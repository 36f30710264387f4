"""Result events and the `type`-discriminated decode_result."""

from __future__ import annotations

import orjson
import pytest

from inflight.schemas import (ErrorEvent, FinalEvent, SchemaError, StatusEvent, Timings, TokenEvent, Usage,
                     decode_result, encode)


def test_each_kind_round_trips_through_decode_result():
    events = [
        TokenEvent(request_id="r", index=0, token_ids=[1, 2], text="hi"),
        FinalEvent(request_id="r", text="hi", token_ids=[1, 2], finish_reason="length",
                   usage=Usage(prompt_tokens=3, completion_tokens=2, cached_prompt_tokens=1),
                   timings=Timings(submitted_at=1.0, first_token_at=1.5, finished_at=2.0),
                   worker="w-0"),
        ErrorEvent(request_id=None, code="invalid_request", message="not JSON"),
    ]
    for event in events:
        back = decode_result(encode(event))
        assert back == event and type(back) is type(event)
    assert events[1].timings.ttft == 0.5 and events[1].usage.total_tokens == 5
    assert orjson.loads(encode(events[2]))["final"] is True


@pytest.mark.parametrize("obj, field, words", [
    ({"type": "bogus", "request_id": "r"}, None, "does not match"),
    ({"request_id": "r", "text": "x"}, None, "type"),
    ({"type": "final", "request_id": "r", "text": "x", "finish_reason": "done"},
     "finish_reason", "'stop'"),
    ({"type": "final", "request_id": "r", "text": 1, "finish_reason": "stop"}, "text", "string"),
    ({"type": "token", "request_id": "r", "index": -1, "token_ids": []}, "index", "greater"),
    ({"type": "token", "request_id": "r", "index": -1, "token_ids": [], "extra": 1}, "index",
     "greater"),
    ({"type": "error", "request_id": "r", "code": "Bad Code", "message": "m"}, "code", "pattern"),
    ({"type": "error", "request_id": "r", "code": "x", "message": "m", "final": False}, "final",
     "True"),
    ({"type": "final", "request_id": "r", "text": "x", "finish_reason": "stop",
      "usage": {"prompt_tokens": -1}}, "usage.prompt_tokens", "greater"),
])
def test_bad_result_events(obj, field, words):
    with pytest.raises(SchemaError) as info:
        decode_result(orjson.dumps(obj))
    assert info.value.field == field, str(info.value)
    assert words in str(info.value)
    assert info.value.request_id == "r"


def test_unknown_fields_of_a_newer_writer_are_ignored():
    """Readers of our own output ignore fields they do not know (schemas/contract.py)."""
    ev = decode_result(orjson.dumps({"type": "final", "request_id": "r", "text": "x",
                                     "finish_reason": "stop", "new_field": [1],
                                     "usage": {"prompt_tokens": 1, "reasoning_tokens": 4}}))
    assert isinstance(ev, FinalEvent) and ev.usage.prompt_tokens == 1


def test_decode_result_rejects_non_objects():
    for data in (b"", b"null", b"1", b"\x00"):
        with pytest.raises(SchemaError):
            decode_result(data)


def test_status_event_and_attempts_round_trip():
    status = StatusEvent(request_id="r", attempt="w1.7", worker="host:1", at=12.5)
    delta = TokenEvent(request_id="r", attempt="w1.7", index=2, start=5, token_ids=[9, 9],
                       text="ab")
    final = FinalEvent(request_id="r", attempt="w1.7", text="x", finish_reason="stop")
    error = ErrorEvent(request_id="r", attempt="w1.7", code="message_too_large", message="m")
    for event in (status, delta, final, error):
        back = decode_result(encode(event))
        assert back == event and type(back) is type(event) and back.attempt == "w1.7"
    assert orjson.loads(encode(status)) == {
        "type": "status", "schema_version": 1, "request_id": "r", "attempt": "w1.7",
        "status": "running", "worker": "host:1", "at": 12.5}
    # events of the older shape (no attempt, no start) still decode
    old = decode_result(b'{"type":"token","request_id":"r","index":0,"token_ids":[1],"text":"a"}')
    assert old.attempt is None and old.start == 0
    with pytest.raises(SchemaError) as info:
        decode_result(orjson.dumps({"type": "status", "request_id": "r", "status": "done"}))
    assert info.value.field == "status"
    with pytest.raises(SchemaError) as info:
        decode_result(orjson.dumps({"type": "token", "request_id": "r", "index": 0, "start": -1,
                                    "token_ids": []}))
    assert info.value.field == "start"
