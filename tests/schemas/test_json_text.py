"""The one JSON parser for text from outside (schemas/json_text.py): what it refuses, with
which code and field, and what it lets through; and the bundled model's name it shares
with the engine."""

from __future__ import annotations

import orjson
import pytest

from inflight.schemas import SchemaError
from inflight.schemas.json_text import parse_json


@pytest.mark.parametrize("data, code, field", [
    (b'{"a": [1, "\\ud800x"]}', "lone_surrogate", "a.1"),
    (b'{"\\udc00": 1}', "lone_surrogate", "\\\\udc00"),  # a key: named printably
    (b'{"a": "\xed\xa0\x80"}', "invalid_utf8", None),     # a surrogate encoded as UTF-8
    (b'{"a": "\xc3"}', "invalid_utf8", None),
    (b'[' * 1100 + b']' * 1100, "json_too_deep", None),
    (b'{"a": ' + b'[' * 201 + b']' * 201 + b'}', "json_too_deep", None),  # orjson parses it
    ('{"a": 1}'.encode("utf-16-le"), "json_invalid", None),  # no BOM: the stdlib would guess
    ('{"a": 1}'.encode("utf-32-be"), "json_invalid", None),
    (b'{"a": NaN, "b": "\\ud83d"}', "lone_surrogate", "b"),  # the lenient path checks too
    (b'{"a": ', "json_invalid", None),
])
def test_refused_with_a_code(data, code, field):
    with pytest.raises(SchemaError) as err:
        parse_json(data)
    assert err.value.code == code
    if field is not None:
        assert err.value.field == field.encode().decode("unicode_escape")


def test_accepted():
    assert parse_json(b'\xef\xbb\xbf{"a": 1}') == {"a": 1}             # a BOM is dropped
    assert parse_json(b'{"a": "\\ud83d\\ude00"}') == {"a": "\U0001F600"}  # a surrogate pair
    assert parse_json(b'{"t": NaN}')["t"] != parse_json(b'{"t": NaN}')["t"]  # the model names it
    assert parse_json(b'{"a": "x\\u0000y"}') == {"a": "x\x00y"}
    with pytest.raises(SchemaError) as err:
        parse_json(b'{"a": {"b": "x\\u0000y"}}', forbid_nul=True)
    assert (err.value.code, err.value.field) == ("nul_character", "a.b")


def test_the_bundled_model_name_is_the_engines():
    from inflight.engine.model_folder import DEFAULT_MODEL_NAME
    from inflight.schemas.settings import BUNDLED_MODEL_NAME

    assert BUNDLED_MODEL_NAME == DEFAULT_MODEL_NAME


@pytest.mark.parametrize("data", [
    b'{"k\\ud800": 1}', b'{"a": {"\\udfff\\u0001": [1]}}', b'{"a\\u0000": "x\\u0000"}',
    b'{"a": ' + b'[' * 200 + b']' * 200 + b'}', b'{"a": 1' + b'0' * 400 + b', "b": NaN}',
    b'[-' + b'9' * 60 + b']',
])
def test_what_passes_and_what_an_error_says_can_be_encoded_again(data):
    """orjson encodes 254 levels and 64-bit integers; its own parser reads more. Whatever
    parse_json lets through, and the field its error names, encodes (wrapped in two more
    levels, as a batch line's body or a request's metadata is)."""
    try:
        value = parse_json(data, forbid_nul=True)
    except SchemaError as err:
        orjson.dumps({"param": err.field, "message": err.message})
        assert err.field is None or "\\u" in err.field  # a bad key, as an escape
        return
    orjson.dumps({"body": {"metadata": value}})


def test_hints_for_utf16_text_and_a_lone_carriage_return():
    with pytest.raises(SchemaError) as err:
        parse_json('{"a": 1}\n'.encode("utf-16-le"))
    assert "UTF-16" in err.value.message
    with pytest.raises(SchemaError) as err:
        parse_json(b'{"a": 1}\r{"b": 2}')
    assert "carriage return" in err.value.message
    assert parse_json(b'{"a": 1}\r\n') == {"a": 1}  # CRLF is whitespace
    assert parse_json(b'{"a": 1' + b'0' * 400 + b'}') == {"a": float("inf")}  # as 1e400 reads
    with pytest.raises(SchemaError) as err:  # a BOM alone is an empty document, not UTF-16
        parse_json(b"\xef\xbb\xbf")
    assert "UTF-16" not in err.value.message and "empty" in err.value.message
