"""Tool calls read out of an answer while it streams: text deltas in, OpenAI chunk deltas out.

    stream = ToolCallStream(request_id)
    for text in deltas: for d in stream.feed(text): send {"choices": [{"delta": d, ...}]}
    for d in stream.finish(): ...        # what was held back; stream.calls says if any came

Text outside calls comes out as `{"content": ...}`, minus a tail that could still become
`<tool_call>` (held back until it cannot). A call comes out as OpenAI streams one: first
`{"tool_calls": [{"index": i, "id": ..., "type": "function", "function": {"name": N,
"arguments": ""}}]}` once its name is complete, then `{"tool_calls": [{"index": i,
"function": {"arguments": piece}}]}` as its arguments' JSON arrives. The ids and the
concatenated arguments are exactly those `schemas.tools.parse_tool_calls` reads from the
whole answer.
"""

from __future__ import annotations

import json
import re
from typing import Any

from inflight.schemas.tools import CALL_CLOSE, CALL_OPEN, partial_tail, tool_call_id

# a call's head, up to the first character of its arguments (so no whitespace is left over)
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*(?=\S)')
_TEXT, _HEADER, _ARGS, _TAIL = "text", "header", "args", "tail"


class ToolCallStream:
    def __init__(self, request_id: str):
        self.request_id = request_id
        self.calls = 0
        self._state = _TEXT
        self._buf = ""          # text not yet decided on
        self._depth = 0         # JSON nesting inside the arguments
        self._in_str = self._esc = False

    def feed(self, text: str) -> list[dict[str, Any]]:
        self._buf += text
        out: list[dict[str, Any]] = []
        while True:
            step = getattr(self, "_" + self._state)(out)
            if not step:
                return out

    def finish(self, cut: bool = False) -> list[dict[str, Any]]:
        """The end of the answer: held-back text, as content. A call cut short stays as far
        as it came (its deltas are out: OpenAI's and Anthropic's streams do the same); no
        markup of it is sent as content. `cut` (the answer ended at max_tokens): a held
        tail that could begin `<tool_call>` is dropped, as parse_tool_calls drops it."""
        out = self.feed("")
        if self._state == _TEXT and cut:
            self._buf = self._buf[:len(self._buf) - partial_tail(self._buf, CALL_OPEN)]
        if self._state == _TEXT and (self._buf.strip() or (self._buf and not self.calls)):
            out.append({"content": self._buf})
        self._buf = ""
        return out

    # -- states: each returns True when it moved on and the loop should look again ------
    def _text(self, out: list) -> bool:
        # NOTE: whitespace alone is held too: between calls it is no content
        buf = self._buf
        at = buf.find(CALL_OPEN)
        if at >= 0:
            if buf[:at].strip():
                out.append({"content": buf[:at]})
            self._buf = buf[at + len(CALL_OPEN):]
            self._state = _HEADER
            return True
        cut = len(buf) - partial_tail(buf, CALL_OPEN)
        if buf[:cut].strip():
            out.append({"content": buf[:cut]})
            self._buf = buf[cut:]
        return False

    def _header(self, out: list) -> bool:
        m = _HEAD.match(self._buf)
        if m is None:
            return False
        out.append({"tool_calls": [{"index": self.calls, "id": tool_call_id(self.request_id, self.calls),
                                    "type": "function",
                                    "function": {"name": json.loads(m.group(1)), "arguments": ""}}]})
        self._buf = self._buf[m.end():]
        self._state, self._depth, self._in_str, self._esc = _ARGS, 0, False, False
        return True

    def _args(self, out: list) -> bool:
        buf, end = self._buf, None
        for i, ch in enumerate(buf):
            if self._in_str:
                if self._esc:
                    self._esc = False
                elif ch == "\\":
                    self._esc = True
                elif ch == '"':
                    self._in_str = False
                    end = i + 1 if self._depth == 0 else None
            elif ch == '"':
                self._in_str = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                if self._depth == 0:
                    end = i + 1
            elif self._depth == 0 and (ch in ",\n" or ch.isspace()) and i:
                end = i  # a bare scalar argument value ended
            if end is not None:
                break
        piece = buf if end is None else buf[:end]
        if piece:
            out.append({"tool_calls": [{"index": self.calls, "function": {"arguments": piece}}]})
        if end is None:
            self._buf = ""
            return False
        self._buf = buf[end:]
        self._state = _TAIL
        self.calls += 1
        return True

    def _tail(self, out: list) -> bool:
        buf = self._buf
        m = re.match(r"\s*\}\s*" + re.escape(CALL_CLOSE), buf)
        if m is not None:
            self._buf = buf[m.end():]
            self._state = _TEXT
            return True
        return False
