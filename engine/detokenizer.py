"""Incremental detokenization and stop strings: correct UTF-8 text deltas, one token at a time.

Decoding token by token would split multi-byte characters (and lose SentencePiece's
leading spaces), so each step decodes a short window twice, the text already read and the
text with the new token, and emits the difference only once it no longer ends in U+FFFD:

    ids:   ... [prefix_offset ........ read_offset | new ]
                 ^ already emitted text comes from here   ^ new text = full - prefix

Stop strings are searched in the output text; the text after (and including) a stop
string is dropped, and while streaming, a tail that could still become a stop string is
held back, so a stop string is never emitted, even when it spans tokens.
"""

from __future__ import annotations

from typing import Sequence

from engine.tokenizer import Tokenizer

PROMPT_CONTEXT = 4  # prompt tokens that seed the window (leading-space rules)


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: Sequence[int], stop: Sequence[str] = ()):
        self.tokenizer = tokenizer
        self.ids: list[int] = list(prompt_token_ids[-PROMPT_CONTEXT:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.stop = tuple(stop)
        self.max_stop_len = max((len(s) for s in self.stop), default=0)
        self.text = ""          # output text so far (cut at a stop string)
        self.num_emitted = 0    # chars of self.text already handed out as deltas
        self.stopped = False

    def add_token(self, token_id: int) -> bool:
        """Append one output token; return True when a stop string was found (text is cut)."""
        self.ids.append(token_id)
        decode = self.tokenizer.decode
        prefix = decode(self.ids[self.prefix_offset:self.read_offset])
        full = decode(self.ids[self.prefix_offset:])
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return False  # an incomplete character: wait for the next token
        new = full[len(prefix):]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        start = max(0, len(self.text) - self.max_stop_len + 1)
        self.text += new
        if self.stop:
            hits = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
            if hits:
                self.text = self.text[:min(hits)]
                self.stopped = True
                return True
        return False

    def take_delta(self, final: bool) -> str:
        """The text not handed out yet; while streaming, minus a possible stop-string start."""
        end = len(self.text)
        if not final and self.stop:
            end -= self._held_back()
        delta = self.text[self.num_emitted:end]
        self.num_emitted = max(self.num_emitted, end)
        return delta

    def _held_back(self) -> int:
        text = self.text
        for n in range(min(self.max_stop_len - 1, len(text)), 0, -1):
            tail = text[-n:]
            if any(s.startswith(tail) for s in self.stop):
                return n
        return 0
