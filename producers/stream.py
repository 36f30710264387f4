"""One request's events as a reader gets them: its token deltas (inflight.results.tokens)
and its status and final event (inflight.results), as one ordered stream (the process's
results reader, producers/results_reader.py, runs one assembler per followed request).

    reader sees:  TokenEvent index 0, 1, 2 ...  [TokenEvent index 0 ... : started over]  final

Rules (StreamAssembler):
- deltas of one attempt come out in index order (a replay of an index already given is
  dropped);
- a delta of an attempt not seen before starts the text over: it comes out with index 0,
  and the reader drops what it had (`if event.index == 0: text = ""`); deltas of an
  attempt given up on are ignored, so two attempts are never mixed;
- the stream ends at the first final (FinalEvent or ErrorEvent) of any attempt. Before a
  FinalEvent comes whatever its text has that the deltas did not bring (a request that
  did not stream, a stream started after the deltas were gone, deltas still on their
  way, or another attempt's final: then a full index-0 delta), so the deltas since the
  last index 0 always add up to the final's text and tokens.
"""

from __future__ import annotations

from inflight.schemas import ErrorEvent, FinalEvent, StatusEvent, TokenEvent

# what a reader gets from one request's stream
StreamEvent = TokenEvent | FinalEvent | ErrorEvent


class StreamAssembler:
    """Turns one request's events, as they arrive from two topics, into the reader's stream."""

    def __init__(self) -> None:
        self.attempt: str | None = None
        self.started = False                 # a delta of the current attempt was given
        self._given_up: set[str | None] = set()
        self._expected = 0                   # next index of the current attempt
        self._held: dict[int, TokenEvent] = {}
        self._tokens: list[int] = []
        self._text: list[str] = []
        self._index_out = 0                  # index of the next delta given to the reader
        self.done = False

    def feed(self, event: TokenEvent | StatusEvent | FinalEvent | ErrorEvent) -> list[StreamEvent]:
        """What the reader gets now (maybe nothing); `done` turns True at the final."""
        if self.done or isinstance(event, StatusEvent):
            return []
        if isinstance(event, TokenEvent):
            return self._delta(event)
        self.done = True
        if isinstance(event, ErrorEvent):
            return [event]
        return self._completion(event) + [event]

    def _delta(self, ev: TokenEvent) -> list[TokenEvent]:
        if not self.started or ev.attempt != self.attempt:
            if ev.attempt in self._given_up:
                return []                    # a late delta of an attempt given up on
            if self.started:
                self._given_up.add(self.attempt)
            self._restart(ev.attempt)
        if ev.index < self._expected:
            return []
        self._held[ev.index] = ev
        out = []
        while self._expected in self._held:
            out.append(self._give(self._held.pop(self._expected)))
            self._expected += 1
        return out

    def _restart(self, attempt: str | None) -> None:
        self.attempt, self.started = attempt, True
        self._expected, self._held = 0, {}
        self._tokens, self._text, self._index_out = [], [], 0

    def _give(self, ev: TokenEvent) -> TokenEvent:
        self._tokens.extend(ev.token_ids)
        self._text.append(ev.text)
        if ev.index != self._index_out:
            ev = ev.model_copy(update={"index": self._index_out})
        self._index_out += 1
        return ev

    def _completion(self, final: FinalEvent) -> list[TokenEvent]:
        text = "".join(self._text)
        same = (self.started and final.attempt == self.attempt
                and final.token_ids[:len(self._tokens)] == self._tokens
                and final.text.startswith(text))
        if not same:
            if not final.token_ids and not final.text and not self.started:
                return []
            self._restart(final.attempt)
            text = ""
        rest_ids, rest_text = final.token_ids[len(self._tokens):], final.text[len(text):]
        if not rest_ids and not rest_text:
            return []
        content = final.logprobs.content if final.logprobs is not None else None
        lps = content[len(self._tokens):] if content is not None else None
        return [self._give(TokenEvent(request_id=final.request_id, attempt=final.attempt,
                                      index=self._index_out, start=len(self._tokens),
                                      token_ids=rest_ids, text=rest_text, logprobs=lps))]
