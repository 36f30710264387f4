"""Incremental detokenization and stop strings: correct UTF-8 text deltas, one token at a time.

Decoding token by token would split multi-byte characters (and lose SentencePiece's
leading spaces), so the text of a short window of ids is decoded with and without the
new token, and the difference is emitted once it no longer ends in U+FFFD:

    ids:   ... [prefix_offset ........ read_offset | new ]
                 ^ already emitted text comes from here   ^ new text = full - prefix

`tokenizers.decoders.DecodeStream` runs exactly that window in Rust: one call per token.
It is seeded with the last prompt tokens (leading-space rules), cut back so that they do
not end inside a character.

Stop strings are searched in the output text; the text after (and including) a stop
string is dropped, and while streaming, a tail that could still become a stop string is
held back, so a stop string is never emitted, even when it spans tokens.

NOTE: work per token is constant: the text is kept as emitted pieces plus the short
pending tail (joined only when `text` is read, at the end), and stop strings are searched
only in the new text plus the `max_stop_len - 1` characters before it.
"""

from __future__ import annotations

import logging
from typing import Sequence

from tokenizers.decoders import DecodeStream

from inflight.engine.tokenizer import Tokenizer

log = logging.getLogger(__name__)

PROMPT_CONTEXT = 4  # prompt tokens that seed the window (leading-space rules)


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: Sequence[int], stop: Sequence[str] = ()):
        self._hf = tokenizer.hf
        self._ids: list[int] = list(prompt_token_ids[-PROMPT_CONTEXT:])  # recent ids (recovery)
        self._stream = self._new_stream(self._ids)
        self.stop = tuple(stop)
        self.max_stop_len = max((len(s) for s in self.stop), default=0)
        self._parts: list[str] = []  # text handed out as deltas, in order
        self._pending = ""           # text not handed out yet
        self._window = ""            # last max_stop_len - 1 chars of the text (stop search)
        self.stopped = False
        self.stop_hit: str | None = None  # the stop string that ended the text

    def _new_stream(self, seed: list[int]) -> DecodeStream:
        seed = seed[-PROMPT_CONTEXT:]
        # A seed ending inside a character would make the stream emit the seed's own text.
        while seed and self._hf.decode(seed, skip_special_tokens=True).endswith("\ufffd"):
            seed = seed[:-1]
        try:
            return DecodeStream(ids=seed, skip_special_tokens=True)
        except TypeError:  # tokenizers before `ids=`: prime the window by stepping the seed
            stream = DecodeStream(skip_special_tokens=True)
            for token_id in seed:
                stream.step(self._hf, token_id)
            return stream

    @property
    def text(self) -> str:
        """The output text so far (cut at a stop string)."""
        return "".join(self._parts) + self._pending

    def add_token(self, token_id: int) -> bool:
        """Append one output token; return True when a stop string was found (text is cut)."""
        ids = self._ids
        ids.append(token_id)
        if len(ids) > 4 * PROMPT_CONTEXT:
            del ids[:-PROMPT_CONTEXT]
        try:
            new = self._stream.step(self._hf, token_id)
        except Exception as exc:  # noqa: BLE001 - tokenizers raises plain Exception
            # DecodeStream refuses a window whose text does not extend the previous one
            # ("invalid prefix", seen with some byte-fallback sequences): start a fresh
            # window from the recent ids, as vLLM does.
            log.debug("detokenizer window reset after %r", exc)
            self._stream = self._new_stream(ids[:-1])
            new = self._stream.step(self._hf, token_id)
        if not new:
            return False  # an incomplete character (or a skipped special token): wait
        if not self.stop:
            self._pending += new
            return False
        window = self._window + new
        hits = [(i, s) for i, s in ((window.find(s), s) for s in self.stop) if i >= 0]
        if hits:
            at, self.stop_hit = min(hits, key=lambda h: h[0])
            # the cut lies in the pending text: a possible stop-string start is never handed out
            cut = len(window) - at  # characters to drop from the end of the text
            self._pending = (self._pending + new)[:-cut] if cut else self._pending + new
            self.stopped = True
            return True
        self._pending += new
        self._window = window[-(self.max_stop_len - 1):] if self.max_stop_len > 1 else ""
        return False

    def take_delta(self, final: bool) -> str:
        """The text not handed out yet; while streaming, minus a possible stop-string start."""
        delta = self._pending
        if not final and self.stop:
            held = self._held_back()
            if held:
                delta = delta[:-held] if held < len(delta) else ""
                self._pending = self._pending[len(delta):]
            else:
                self._pending = ""
        else:
            self._pending = ""
        if delta:
            self._parts.append(delta)
        return delta

    def _held_back(self) -> int:
        """Length of the longest tail of the text that starts some stop string."""
        text = self._window  # holds the last max_stop_len - 1 characters
        for n in range(min(self.max_stop_len - 1, len(text)), 0, -1):
            tail = text[-n:]
            if any(s.startswith(tail) for s in self.stop):
                return n
        return 0
