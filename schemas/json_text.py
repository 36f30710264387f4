"""The one JSON parser for text that arrives from outside: HTTP bodies, batch-file lines,
Kafka messages. What passes here can be stored, re-read and encoded again by any part of
the service (orjson, Postgres JSONB, SQLite), so nothing that passed fails later.

    bytes ─► BOM stripped ─► orjson ─┬─► ok ─► nested too deep? ─────────────► object
                                     └─► error: classify it (code, field)
                                          not UTF-8          -> invalid_utf8 (byte offset)
                                          lone surrogate     -> lone_surrogate (the field's path)
                                          nested too deep    -> json_too_deep
                                          NaN / Infinity     -> parsed; the caller's model
                                          a number over 1e308   names the field that has one
                                                                (it reads as +-Infinity, as
                                                                orjson reads 2**64 as a float)
                                          anything else      -> json_invalid (orjson's words,
                                                                with a hint for UTF-16 text
                                                                and lines ended by a lone CR)

MAX_DEPTH is below what orjson can *encode* (254 levels), with room for the envelopes the
service wraps a value in (a batch line's body, a request's metadata). A field path that
names a key is printable: a surrogate or control character in it is written as \\uXXXX,
so the error itself can always be encoded and stored.

`forbid_nul=True` (batch lines) also refuses the NUL character anywhere (Postgres text and
JSONB cannot hold it), naming the field.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

from inflight.schemas.errors import SchemaError

BOM = b"\xef\xbb\xbf"
MAX_DEPTH = 200  # orjson parses 1024 levels but encodes only 254
ERR_JSON = "json_invalid"
ERR_TOO_DEEP = "json_too_deep"
ERR_UTF8 = "invalid_utf8"
ERR_SURROGATE = "lone_surrogate"
ERR_NUL = "nul_character"

_SURROGATE = re.compile("[\ud800-\udfff]")


def parse_json(data: bytes | bytearray | memoryview | str, *, what: str = "the body",
               forbid_nul: bool = False) -> Any:
    """`data` as a JSON value, or SchemaError with a `code` (above) and, for a bad string,
    the `field` that holds it (dotted path: `messages.0.content`)."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    elif not isinstance(data, bytes):
        data = bytes(data)
    if data.startswith(BOM):
        data = data[len(BOM):]
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        value = _classify(data, exc, what)
    else:
        # NOTE: a value nests at most one level per bracket: most bodies skip the walk
        if data.count(b"[") + data.count(b"{") > MAX_DEPTH and _depth_over(value, MAX_DEPTH):
            raise _too_deep(what)
    if forbid_nul:
        refuse_nul(value, data)
    return value


def refuse_nul(value: Any, data: bytes) -> None:
    """SchemaError naming the field when `value` (parsed from `data`) holds a NUL."""
    if b"\\u0000" in data:
        path = find_string(value, lambda s: "\x00" in s)
        if path is not None:
            path = printable(path)
            raise SchemaError(f"{_at(path)}contains the NUL character (\\u0000), which the "
                              "store cannot hold; remove it", field=path or None, code=ERR_NUL)


def _classify(data: bytes, exc: orjson.JSONDecodeError, what: str) -> Any:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as bad:
        raise SchemaError(f"{what} is not valid JSON: not UTF-8 at byte {bad.start} "
                          f"({data[bad.start:bad.start + 4]!r}); send UTF-8 text",
                          code=ERR_UTF8) from None
    if "depth" in str(exc):
        raise _too_deep(what) from None
    try:  # the stdlib reads what orjson refuses: NaN/Infinity literals, lone surrogates and
        # numbers over 1e308. NOTE: from the text, not the bytes (bytes would let it guess
        # UTF-16 or UTF-32, which orjson and the rest of the service do not read)
        value = json.loads(data.decode("utf-8"), parse_int=_int)
    except RecursionError:
        raise _too_deep(what) from None
    except ValueError:
        raise SchemaError(f"{what} is not valid JSON: {exc}{_hint(data)}", code=ERR_JSON) from None
    if _depth_over(value, MAX_DEPTH):
        raise _too_deep(what)
    path = find_string(value, lambda s: _SURROGATE.search(s) is not None)
    if path is not None:
        path = printable(path)
        raise SchemaError(f"{_at(path)}holds a lone UTF-16 surrogate (\\ud800-\\udfff without "
                          "its pair), which is not a character; send valid text",
                          field=path or None, code=ERR_SURROGATE)
    return value  # only NaN/Infinity were wrong: the model that validates it names the field


def _int(text: str) -> int | float:
    """An integer literal as orjson reads it: beyond 64 bits it is a float (inf past 1e308),
    so nothing that passed holds an integer the encoder refuses."""
    value = int(text) if len(text) <= 20 else None
    return value if value is not None and -2**63 <= value < 2**64 else float(text)


def _too_deep(what: str) -> SchemaError:
    return SchemaError(f"{what} is nested more than {MAX_DEPTH} levels deep; flatten it",
                       code=ERR_TOO_DEEP)


def _hint(data: bytes) -> str:
    if data and data.count(b"\x00") * 4 >= len(data):
        return " (a NUL byte in every other byte or so: UTF-16 or UTF-32 text? send UTF-8)"
    if b"\r" in data.replace(b"\r\n", b""):
        return " (it holds a carriage return (\\r) alone; end each line with \\n or \\r\\n)"
    return ""


_UNPRINTABLE = re.compile("[\x00-\x1f\x7f\ud800-\udfff]")


def printable(text: str) -> str:
    """`text` with control characters and lone surrogates written as \\uXXXX escapes: a key
    from the input named in an error message, which must encode as UTF-8 and be stored."""
    return _UNPRINTABLE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _at(path: str) -> str:
    return f"{path}: " if path else ""


def find_string(value: Any, bad: Any) -> str | None:
    """The dotted path of the first string (key or value) for which `bad(s)` holds ("" for
    the top level), else None. Iterative: any depth the parser took."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if bad(item):
                return path
        elif isinstance(item, dict):
            for k, v in reversed(list(item.items())):
                sub = f"{path}.{k}" if path else str(k)
                if bad(k):
                    return sub
                stack.append((v, sub))
        elif isinstance(item, list):
            for i in range(len(item) - 1, -1, -1):
                stack.append((item[i], f"{path}.{i}" if path else str(i)))
    return None


def _depth_over(value: Any, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return False
