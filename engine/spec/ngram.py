"""N-gram prompt lookup: draft the tokens that followed the last time the context's suffix
appeared in the request's own prompt and output.

    tokens  ... a b c d ... x a b c   <- the suffix "a b c" (n = 3) occurred before;
                      ^ e                 propose what followed it: d ...

The longest suffix of `prompt_lookup_max` down to `prompt_lookup_min` tokens that occurs
earlier wins; among its occurrences, the one nearest to where the request was copying from
(below), else the latest. When what followed it runs into the end of the context (the
context repeats with period p = len - 1 - e), the drafts go on around that period: a loop
is drafted as going on. The search is vectorised over the whole context (numpy), one pass
per suffix length: no Python loop over tokens, however long the context. Each request
keeps its tokens in a numpy array that grows by the new tokens only (`TokenHistory`, kept
by its proposer in `TokenHistories` while the request lives).

Where it was copying from: a request that copies a text with edits (corrects it, quotes it
with small changes) leaves the source at each edit, and no n-gram of the edited output
matches for a token or two. So each request remembers the source position its last drafts
came from (the anchor); the tokens it emitted since move that position on one for one. When
no n-gram matches, its last token is looked for within WINDOW tokens of that position (the
edit was a substitution, an insertion or a deletion of a few tokens) and the drafts go on
from there: copying resumes after one token instead of after `prompt_lookup_min`.
"""

from __future__ import annotations

import numpy as np

from inflight.engine.request import Request


WINDOW = 8  # tokens either side of the anchor searched to take copying up again


class TokenHistory:
    """A request's prompt + output as a growing int64 array (appended, never rewritten:
    a request's tokens only grow), and where its last drafts were copied from."""

    __slots__ = ("buf", "n", "anchor", "anchor_len")

    def __init__(self, capacity: int = 256):
        self.buf = np.empty(capacity, dtype=np.int64)
        self.n = 0
        self.anchor = -1      # drafts were tokens[anchor + 1:] ...
        self.anchor_len = 0   # ... proposed when the history had this many tokens

    def expected(self, length: int) -> int:
        """Where the last token would sit in the source had the request copied on since
        its last drafts (-1: no source)."""
        return self.anchor + length - self.anchor_len if self.anchor >= 0 else -1

    def sync(self, tokens: list[int]) -> np.ndarray:
        """Take the tokens added since the last call; returns the whole history (a view)."""
        new = len(tokens)
        if new > self.n:
            if new > len(self.buf):
                grown = np.empty(max(new, 2 * len(self.buf)), dtype=np.int64)
                grown[:self.n] = self.buf[:self.n]
                self.buf = grown
            self.buf[self.n:new] = tokens[self.n:new]
            self.n = new
        return self.buf[:self.n]


class TokenHistories:
    """The TokenHistory of each request a proposer has seen, until it finishes."""

    def __init__(self) -> None:
        self._of: dict[Request, TokenHistory] = {}

    def of(self, req: Request) -> TokenHistory:
        state = self._of.get(req)
        if state is None:
            state = self._of[req] = TokenHistory(max(256, 2 * req.num_tokens))
        return state

    def sync(self, req: Request) -> np.ndarray:
        """req's tokens so far (a view)."""
        return self.of(req).sync(req.all_token_ids)

    def drop(self, req: Request) -> None:
        self._of.pop(req, None)

    def __len__(self) -> int:
        return len(self._of)


def longest_suffix_match(tokens: np.ndarray, n_min: int, n_max: int) -> tuple[int, np.ndarray]:
    """(n, ends): the longest n in [n_min, n_max] such that tokens[-n:] also occurs ending
    at each position e in `ends` (e < len - 1, so something follows); (0, empty) if none."""
    L = len(tokens)
    empty = np.empty(0, dtype=np.int64)
    if L < n_min + 1:
        return 0, empty
    ends = np.flatnonzero(tokens[:L - 1] == tokens[L - 1])
    best_n, best = (1, ends) if n_min <= 1 and ends.size else (0, empty)
    for j in range(1, min(n_max, L - 1)):
        if ends.size == 0:
            break
        ends = ends[ends >= j]
        ends = ends[tokens[ends - j] == tokens[L - 1 - j]]
        if ends.size and j + 1 >= n_min:
            best_n, best = j + 1, ends
    return best_n, best


def propose_ngram(tokens: np.ndarray, k: int, n_min: int, n_max: int,
                  state: TokenHistory | None = None) -> list[int]:
    """k draft tokens (or none): what followed the occurrence of the longest matching
    suffix nearest to the anchor of `state` (else the latest), or with no match, what
    followed the last token near the anchor. Moves the anchor to where the drafts came
    from; with none, the anchor stays for the next token to find (for WINDOW tokens)."""
    L = len(tokens)
    x = state.expected(L) if state is not None and L - state.anchor_len <= WINDOW else -1
    n, ends = longest_suffix_match(tokens, n_min, n_max)
    e = -1
    if n:
        e = int(ends[-1])
        if x >= 0:
            near = ends[np.abs(ends - x) <= WINDOW]
            if near.size:
                e = int(near[np.abs(near - x).argmin()])
    elif x >= 0:
        lo, hi = max(0, x - WINDOW), min(L - 1, x + WINDOW + 1)
        hits = np.flatnonzero(tokens[lo:hi] == tokens[L - 1]) + lo
        if hits.size:
            e = int(hits[np.abs(hits - x).argmin()])
    if e < 0:
        return []
    if state is not None:
        state.anchor, state.anchor_len = e, L
    return continuation(tokens, e, k)


def continuation(tokens: np.ndarray, e: int, k: int) -> list[int]:
    """k tokens after position e; past the context's end, around the period len - 1 - e."""
    period = len(tokens) - 1 - e
    if period >= k:
        return tokens[e + 1:e + 1 + k].tolist()
    return tokens[e + 1 + np.arange(k) % period].tolist()


class NgramProposer:
    def __init__(self, k: int, n_min: int, n_max: int):
        self.k, self.n_min, self.n_max = k, n_min, n_max
        self.histories = TokenHistories()

    def propose(self, reqs: list[Request], limits: list[int]) -> list[list[int]]:
        """Drafts for each request, at most limits[i] tokens each."""
        h = self.histories
        return [propose_ngram(h.sync(r), min(self.k, lim), self.n_min, self.n_max, h.of(r))
                for r, lim in zip(reqs, limits)]

    def finished(self, req: Request, completed: bool = True) -> None:
        """A request ended (nothing kept across requests)."""
        self.histories.drop(req)
