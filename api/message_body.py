"""A Message Batches body, `{"requests": [{custom_id, params}, ...]}`, read as it arrives:
each request is cut out of the byte stream, parsed (the one JSON parser,
schemas/json_text.py), checked as the batch will check it (producers/batch_lines.py) and
handed on as one JSONL line, so memory holds one request and one piece of the body at a
time, never the body (up to INFLIGHT_API_MAX_UPLOAD_BYTES).

    body pieces ─► RequestItems.feed ─► raw bytes of each request ─► parse, check ─► lines

RequestItems only finds where each element of the `requests` array begins and ends
(strings, escapes and nesting tracked with two regular expressions, so prompt text is
skipped at C speed); what an element holds is the parser's business.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator

import orjson

from inflight.api.errors import APIError
from inflight.producers.batch_lines import LineChecker, ModelLookup
from inflight.schemas.errors import SchemaError
from inflight.schemas.json_text import BOM, ERR_JSON, parse_json
from inflight.schemas.settings import Settings

ENVELOPE = ('the body must be {"requests": [{"custom_id": ..., "params": {...}}, ...]} '
            'with at least one request')
_HEAD = re.compile(rb'\s*\{\s*"((?:[^"\\]|\\.)*)"\s*:\s*\[', re.S)
_TAIL = re.compile(rb'\s*\}\s*', re.S)
_STRUCTURE = re.compile(rb'["{}\[\],]')   # outside strings
_STRING_END = re.compile(rb'["\\]')       # inside a string
HEAD_MAX = 4096                           # bytes before the array's "[" at most
WS = b" \t\r\n"


def _bad(message: str, param: str | None = "requests", code: str = ERR_JSON) -> APIError:
    return APIError(400, message, param=param, code=code)


class RequestItems:
    """The raw bytes of each element of the body's `requests` array, fed in pieces of any
    size; an element over `max_item_bytes` is refused before it is held whole."""

    def __init__(self, max_item_bytes: int):
        self.max_item_bytes = max_item_bytes
        self.buf = bytearray()
        self.state = "head"          # head -> items -> tail
        self.count = 0               # elements given so far
        self._after_comma = False
        self._start = -1             # where the current element starts in buf (-1: not yet)
        self._scan = 0               # where scanning resumes
        self._depth = 0
        self._in_string = False

    def feed(self, piece: bytes) -> list[bytes]:
        self.buf += piece
        out: list[bytes] = []
        if self.state == "head":
            self._head()
        while self.state == "items":
            item = self._item()
            if item is None:
                break
            out.append(item)
        if self.state == "tail" and len(self.buf) > HEAD_MAX:
            raise _bad(f"{ENVELOPE}; found more after the requests array", None)
        if self.state == "items" and len(self.buf) > self.max_item_bytes + HEAD_MAX:
            raise APIError(413, f"requests.{self.count} is over {self.max_item_bytes:,} bytes "
                                "(server setting INFLIGHT_API_MAX_LINE_BYTES); shorten it",
                           param=f"requests.{self.count}", code="request_too_large")
        return out

    def finish(self) -> None:
        """The body ended: it must have ended with the array and the object."""
        if self.state != "tail" or not _TAIL.fullmatch(self.buf):
            raise _bad(f"{ENVELOPE}; the body ended early or has more than that", None)
        if self.count == 0:
            raise _bad(ENVELOPE)

    def _head(self) -> None:
        if len(self.buf) < len(BOM) and BOM.startswith(self.buf):
            return   # maybe a BOM, not all of it yet
        if self.buf.startswith(BOM):
            del self.buf[:len(BOM)]
        m = _HEAD.match(self.buf)
        if m is None:
            if len(self.buf) > HEAD_MAX or (self.buf.lstrip()[:1] not in (b"", b"{")):
                raise _bad(ENVELOPE, None)
            return   # not all of it yet
        try:
            key = json.loads(b'"' + m.group(1) + b'"')
        except ValueError:
            key = None
        if key != "requests":
            raise _bad(ENVELOPE, None)
        del self.buf[:m.end()]
        self.state = "items"

    def _item(self) -> bytes | None:
        """The next complete element (and what ends it consumed), or None for more input."""
        buf = self.buf
        if self._start < 0:
            i = 0
            while i < len(buf) and buf[i] in WS:
                i += 1
            if i == len(buf):
                del buf[:]
                return None
            if buf[i] == 0x5D and not self._after_comma:   # "]": the array ends
                if self.count == 0:
                    raise _bad(ENVELOPE)
                del buf[:i + 1]
                self.state = "tail"
                return None
            self._start, self._scan = i, i
        end = self._scan_to_end()
        if end is None:
            return None
        item = bytes(buf[self._start:end]).rstrip(WS)
        if not item:
            raise _bad(f"requests.{self.count}: a request is missing (two commas, or a "
                       "comma before ']')", f"requests.{self.count}")
        closer = buf[end]
        del buf[:end + 1]
        self._start, self._scan, self._depth = -1, 0, 0
        self.count += 1
        self._after_comma = closer == 0x2C
        if closer == 0x5D:
            self.state = "tail"
        return item

    def _scan_to_end(self) -> int | None:
        """Where the current element ends (its "," or the array's "]" outside strings at
        depth 0), or None for more input; the scan resumes where it stopped."""
        buf, pos = self.buf, self._scan
        while True:
            if self._in_string:
                m = _STRING_END.search(buf, pos)
                if m is None:
                    self._scan = len(buf)
                    return None
                pos = m.start()
                if buf[pos] == 0x5C:           # a backslash: skip what it escapes
                    if pos + 1 >= len(buf):
                        self._scan = pos
                        return None
                    pos += 2
                    continue
                self._in_string = False
                pos += 1
                continue
            m = _STRUCTURE.search(buf, pos)
            if m is None:
                self._scan = len(buf)
                return None
            pos = m.start()
            c = buf[pos]
            if c == 0x22:                      # '"'
                self._in_string = True
            elif c in (0x7B, 0x5B):            # '{' '['
                self._depth += 1
            elif c in (0x7D, 0x5D):            # '}' ']'
                if self._depth == 0:
                    if c == 0x5D:
                        return pos
                    raise _bad(f"requests.{self.count} is not valid JSON (an unmatched '}}')",
                               f"requests.{self.count}")
                self._depth -= 1
            elif self._depth == 0:             # ','
                return pos
            pos += 1


def message_batch_lines(pieces: Iterable[bytes], *, batch_id: str, settings: Settings,
                        context: int | None,
                        models: ModelLookup | None = None) -> Iterator[bytes]:
    """The body's requests as JSONL lines (each ending in a newline), checked against the
    upload caps and, each, as the batch will check it (producers.batch_lines: parameters,
    unique custom_ids, a served model and its context): a bad request refuses the whole
    batch with the path of its bad field, as Anthropic's API does (APIError)."""
    s = settings
    items = RequestItems(s.api_max_line_bytes)
    checker = LineChecker(batch_id, "/v1/messages", context=context,
                          max_prompt_chars=s.max_prompt_chars,
                          max_line_bytes=s.kafka_max_message_bytes, models=models,
                          one_model=s.batch_one_model_per_file,
                          default_topic=s.topic_requests_batch)
    i = 0
    for piece in pieces:
        for raw in items.feed(piece):
            if i >= s.api_max_upload_lines:
                raise APIError(413, f"more than {s.api_max_upload_lines:,} requests is over "
                                    "the limit (server setting INFLIGHT_API_MAX_UPLOAD_LINES); "
                                    "split them into several batches", param="requests")
            yield _line(raw, i, checker, s) + b"\n"
            i += 1
    items.finish()


def _line(raw: bytes, i: int, checker: LineChecker, s: Settings) -> bytes:
    try:
        item = parse_json(raw, what=f"requests.{i}")
    except SchemaError as exc:
        # a field's path is inside the request (the rest name `requests.{i}` already);
        # the client's path starts at the body
        field = f"requests.{i}.{exc.field}" if exc.field else f"requests.{i}"
        message = (f"requests.{i}.{exc.message}" if exc.field and exc.message.startswith(exc.field)
                   else exc.message)
        raise APIError(400, message, param=field, code=exc.code) from None
    if not (isinstance(item, dict) and set(item) == {"custom_id", "params"}
            and isinstance(item["custom_id"], str) and isinstance(item["params"], dict)):
        raise APIError(400, f"requests.{i}: give exactly custom_id (a string) and params "
                            "(a Messages API request)", param=f"requests.{i}")
    line = orjson.dumps(item)  # NOTE: parse_json let through nothing it cannot encode
    if len(line) > s.api_max_line_bytes:
        raise APIError(413, f"requests.{i} is {len(line):,} bytes, over the limit of "
                            f"{s.api_max_line_bytes:,} (server setting "
                            "INFLIGHT_API_MAX_LINE_BYTES)", param=f"requests.{i}")
    try:
        # the parsed item, not `line` read back: a NaN would read as null there
        checker.convert_object(item, line)
    except SchemaError as exc:
        field = f"requests.{i}.{exc.field}" if exc.field else f"requests.{i}"
        raise APIError(400, f"requests.{i}: {exc.message}", param=field, code=exc.code) from None
    return line
