"""Incremental detokenization and stop strings: correct UTF-8 text deltas, one token at a time.

Decoding token by token would split multi-byte characters (and lose SentencePiece's
leading spaces), so the new tokens are decoded in a short window after a few earlier
tokens (the context), and the window's text is handed out once it is final:

    ids:   ... [ context (<= 4 ids) | window: tokens since the last final point ]
    window text = decode(context + window)[len(decode(context)):]

The window's text is final when it does not end in U+FFFD (an incomplete character) and,
for a byte-fallback tokenizer (Llama 2, Mistral: `<0xE4>` pieces), its last token is
neither a byte piece nor a special token (such a decoder turns a whole run of byte
pieces that is not valid UTF-8 into one U+FFFD per byte, and a run goes on across the
special tokens the decode skips, so a later byte could still change the run's text). Then it is
handed out and the window starts over after it, its context the last non-special ids.
At such points decoding is additive (a byte-level decode restarts at a whole character, a
byte-fallback run ends at a piece that is not a byte), so the deltas are exactly a prefix
of the decode of all tokens.

Stop strings are searched in the output text; the text after (and including) a stop
string is dropped, and while streaming, a tail that could still become a stop string is
held back, so a stop string is never emitted, even when it spans tokens.

NOTE: work per token is constant: the text is kept as emitted pieces plus the short
pending tail, and stop strings are searched only in the new text plus the
`max_stop_len - 1` characters before it.

The final text is not these deltas joined: it is `output_text`, a pure function of the
final tokens, decoded once at the end (the one place every path's final text comes from:
final event, stored row, the waiting answers). The deltas are always a prefix of it
(tests/engine/test_detokenizer.py checks that over random token sequences), so the last
delta is the final text past what was handed out: a trailing incomplete character, which
the deltas hold back, comes out as the U+FFFD a decode of the tokens gives it.
"""

from __future__ import annotations

import logging
from typing import Sequence

from inflight.engine.tokenizer import Tokenizer

log = logging.getLogger(__name__)

PROMPT_CONTEXT = 4  # ids before the window (leading-space rules)
REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: Sequence[int], stop: Sequence[str] = ()):
        self._hf = tokenizer.hf
        self._special = tokenizer.special_ids
        self._byte_piece = tokenizer.byte_piece_ids  # empty unless byte-fallback
        self.context = context_ids(tokenizer, prompt_token_ids)
        self._ctx: list[int] = list(self.context)
        self._win: list[int] = []
        self._stream = None
        if self._byte_piece:
            self._ctx_text = self._decode(self._ctx)
        else:
            # NOTE: the same window, run in Rust by `tokenizers`' DecodeStream (one call per
            # token, ~15x cheaper than two decodes from Python): exact for decoders without
            # byte-fallback runs (byte-level: tests/engine/test_detokenizer.py)
            self._ids: list[int] = list(self.context)  # recent ids (a window reset)
            self._stream = self._new_stream(self._ids)
        self.stop = tuple(stop)
        self.max_stop_len = max((len(s) for s in self.stop), default=0)
        self._parts: list[str] = []  # text handed out as deltas, in order
        self._pending = ""           # text not handed out yet
        self._window = ""            # last max_stop_len - 1 chars of the text (stop search)
        self.stopped = False
        self.stop_hit: str | None = None  # the stop string that ended the text

    def _decode(self, ids: list[int]) -> str:
        return self._hf.decode(ids, skip_special_tokens=True) if ids else ""

    def _new_stream(self, seed: list[int]):
        from tokenizers.decoders import DecodeStream

        seed = seed[-PROMPT_CONTEXT:]
        while seed and self._decode(seed).endswith(REPLACEMENT):
            seed = seed[:-1]
        try:
            return DecodeStream(ids=seed, skip_special_tokens=True)
        except TypeError:  # tokenizers before `ids=`: prime the window by stepping the seed
            stream = DecodeStream(skip_special_tokens=True)
            for token_id in seed:
                stream.step(self._hf, token_id)
            return stream

    def _stream_step(self, token_id: int) -> str:
        ids = self._ids
        ids.append(token_id)
        if len(ids) > 4 * PROMPT_CONTEXT:
            del ids[:-PROMPT_CONTEXT]
        try:
            return self._stream.step(self._hf, token_id) or ""
        except Exception as exc:  # noqa: BLE001 - tokenizers raises plain Exception
            # DecodeStream refuses a window whose text does not extend the previous one
            # ("invalid prefix"): start a fresh window from the recent ids, as vLLM does
            log.debug("detokenizer window reset after %r", exc)
            self._stream = self._new_stream(ids[:-1])
            return self._stream.step(self._hf, token_id) or ""

    def _step(self, token_id: int) -> str:
        """The final text token_id completes ("" while the window's text may change)."""
        if self._stream is not None:
            return self._stream_step(token_id)
        win = self._win
        win.append(token_id)
        pieces = self._byte_piece
        # NOTE: a special token is skipped by the decode, so a byte run goes on across it
        if token_id in pieces or (pieces and token_id in self._special):
            return ""
        text = self._decode(self._ctx + win)
        ctx_text = self._ctx_text
        if not text.startswith(ctx_text):  # not additive here: decode the window alone
            text, ctx_text = self._decode(win), ""
        new = text[len(ctx_text):]
        if new.endswith(REPLACEMENT):
            return ""
        recent = [t for t in self._ctx + win if t not in self._special]
        self._ctx = recent[-PROMPT_CONTEXT:]
        self._ctx_text = self._decode(self._ctx)
        self._win = []
        return new

    @property
    def text(self) -> str:
        """The output text so far (cut at a stop string)."""
        return "".join(self._parts) + self._pending

    def finish(self, text: str) -> str:
        """The last delta, given the final text (`output_text`): the final text past what
        was handed out. NOTE: the deltas are a prefix of the final text (module doc); were
        they ever not, the final text still wins (readers start over from it) and this
        returns "" rather than a delta that would not add up."""
        sent = "".join(self._parts)
        self._pending = ""
        if not text.startswith(sent):
            log.warning("streamed text %r is not a prefix of the final text %r", sent[-40:],
                        text[-40:])
            return ""
        delta = text[len(sent):]
        if delta:
            self._parts.append(delta)
        return delta

    def add_token(self, token_id: int) -> bool:
        """Append one output token; return True when a stop string was found (text is cut)."""
        new = self._step(token_id)
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


def context_ids(tokenizer: Tokenizer, prompt_token_ids: Sequence[int]) -> list[int]:
    """The prompt ids the output is decoded after (leading-space rules of SentencePiece
    tokenizers: an output's first word keeps its space): the last PROMPT_CONTEXT
    non-special ones, cut back so that they end neither inside a character nor in a byte
    piece (the output would then change the prompt's own text)."""
    special, pieces = tokenizer.special_ids, tokenizer.byte_piece_ids
    ids = [t for t in prompt_token_ids[-4 * PROMPT_CONTEXT:] if t not in special][-PROMPT_CONTEXT:]
    while ids and (ids[-1] in pieces or
                   tokenizer.hf.decode(ids, skip_special_tokens=True).endswith(REPLACEMENT)):
        ids.pop()
    return ids


def output_text(tokenizer: Tokenizer, context: Sequence[int], token_ids: Sequence[int],
                stop: Sequence[str] = (), stop_token_ids: Sequence[int] = (),
                eos_token_ids: Sequence[int] = (), ignore_eos: bool = False) -> tuple[str, str | None]:
    """The final text of an output, and the stop string that cut it (or None): a pure
    function of the tokens (and the request's stop rules), decoded once.

        text = decode(context + ids)[len(decode(context)):]   (special tokens skipped)

    `context`: `context_ids` of the prompt. A last token that ended the request as a
    stop token (EOS unless ignore_eos, or one of stop_token_ids) adds no text, as in vLLM;
    the text is cut before the first stop string in it."""
    ids = list(token_ids)
    if ids and (ids[-1] in stop_token_ids or (not ignore_eos and ids[-1] in eos_token_ids)):
        ids.pop()
    hf = tokenizer.hf
    text = hf.decode(ids, skip_special_tokens=True)
    if context and ids:
        head = hf.decode(list(context), skip_special_tokens=True)
        both = hf.decode(list(context) + ids, skip_special_tokens=True)
        if both.startswith(head):
            text = both[len(head):]
    hit = None
    if stop:
        found = [(i, s) for i, s in ((text.find(s), s) for s in stop) if i >= 0]
        if found:
            at, hit = min(found, key=lambda h: h[0])
            text = text[:at]
    return text, hit
