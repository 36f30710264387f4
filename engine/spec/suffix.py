"""Suffix decoding (after SuffixDecoding, Oliaro et al. 2024): drafts from the request's own
context and from a bounded cache of recent outputs of all requests, so that the tenth
request of a batch of similar prompts can draw on the first nine's answers.

The cache is one flat token array (outputs separated by -1, so no match crosses two)
and an index from each token pair to where it ends in the array:

    corpus   | 5 8 2 9 -1 | 7 5 8 2 4 -1 | ...        oldest output first (FIFO, at most
    index    (5, 8) -> [1, 7]   (8, 2) -> [2, 8]  ...   suffix_decoding_max_cached_requests)

A lookup takes the occurrences of the context's last pair, measures how far back each
matches the context (one vectorised compare over all of them, up to
`suffix_decoding_max_tree_depth` tokens) and keeps the longest matches. The draft then
follows their continuations token by token, taking the most frequent next token while
its share of the matches (multiplied along the way) stays >= `suffix_decoding_min_token_prob`,
for at most `suffix_decoding_max_spec_factor` x the match length tokens. The request's own
context is searched as n-gram lookup does (engine/spec/ngram.py); the longer match wins.
Evicted outputs leave dead positions at the front of the array; it is compacted (and the
index rebuilt) when they are more than half of it, so memory stays within twice the live
outputs.
"""

from __future__ import annotations

import math

import numpy as np

from inflight.engine.request import Request
from inflight.engine.spec.config import SpeculativeConfig
from inflight.engine.spec.ngram import TokenHistories, continuation, longest_suffix_match

MAX_CANDIDATES = 64  # occurrences of a pair considered per lookup (the most recent)


class SuffixCache:
    def __init__(self, max_requests: int, max_depth: int):
        self.max_requests = max_requests
        self.max_depth = max_depth
        self.corpus = np.full(1024, -1, dtype=np.int64)
        self.size = 0          # used length of corpus
        self.live_start = 0    # positions below this belong to evicted outputs
        self.starts: list[int] = []  # start of each live output, oldest first
        self.index: dict[int, list[int]] = {}

    @property
    def num_requests(self) -> int:
        return len(self.starts)

    @staticmethod
    def _keys(a: np.ndarray) -> np.ndarray:
        return (a[:-1] << 32) | (a[1:] & 0xFFFFFFFF)

    def add(self, tokens: list[int]) -> None:
        """Cache one finished output (the oldest goes when the cache is full)."""
        if self.max_requests == 0 or len(tokens) < 3:
            return
        if len(self.starts) >= self.max_requests:
            self.starts.pop(0)
            self.live_start = self.starts[0] if self.starts else self.size
            if self.live_start > self.size // 2:
                self._compact()
        n = len(tokens)
        need = self.size + n + 1
        if need > len(self.corpus):
            grown = np.full(max(need, 2 * len(self.corpus)), -1, dtype=np.int64)
            grown[:self.size] = self.corpus[:self.size]
            self.corpus = grown
        start = self.size
        self.corpus[start:start + n] = tokens
        self.corpus[start + n] = -1
        self.size = start + n + 1
        self.starts.append(start)
        self._index(start, n)

    def _index(self, start: int, n: int) -> None:
        keys = self._keys(self.corpus[start:start + n])
        # pair i ends at start + i + 1; the last pair has nothing after it
        for key, end in zip(keys[:-1].tolist(), range(start + 1, start + n - 1)):
            hits = self.index.get(key)
            if hits is None:
                self.index[key] = [end]
            else:
                hits.append(end)
                if len(hits) > 2 * MAX_CANDIDATES:
                    del hits[:-MAX_CANDIDATES]

    def _compact(self) -> None:
        off = self.live_start
        live = self.corpus[off:self.size].copy()
        self.corpus[:len(live)] = live
        self.corpus[len(live):self.size] = -1
        self.size = len(live)
        self.starts = [s - off for s in self.starts]
        self.live_start = 0
        self.index = {}
        for i, s in enumerate(self.starts):
            end = self.starts[i + 1] if i + 1 < len(self.starts) else self.size
            self._index(s, end - s - 1)

    def lookup(self, ctx: np.ndarray) -> tuple[int, np.ndarray]:
        """(match length, end positions of the longest matches) of ctx's suffix."""
        if len(ctx) < 2 or not self.starts:
            return 0, np.empty(0, dtype=np.int64)
        key = int((ctx[-2] << 32) | (ctx[-1] & 0xFFFFFFFF))
        hits = self.index.get(key)
        if not hits:
            return 0, np.empty(0, dtype=np.int64)
        ends = np.asarray(hits[-MAX_CANDIDATES:], dtype=np.int64)
        ends = ends[ends >= self.live_start]
        if not ends.size:
            return 0, ends
        D = min(self.max_depth, len(ctx))
        back = np.arange(D)
        at = ends[:, None] - back[None, :]
        seen = np.where(at >= self.live_start, self.corpus[np.maximum(at, 0)], -2)
        same = seen == ctx[len(ctx) - 1 - back][None, :]
        lengths = np.cumprod(same, axis=1).sum(axis=1)
        best = int(lengths.max())
        return best, ends[lengths == best]

    def continue_from(self, ends: np.ndarray, max_len: int, min_prob: float) -> list[int]:
        """The most frequent continuation of these matches, while its share holds."""
        at = ends[:, None] + 1 + np.arange(max_len)[None, :]
        conts = np.where(at < self.size, self.corpus[np.minimum(at, self.size - 1)], -1)
        out: list[int] = []
        prob = 1.0
        for t in range(max_len):
            col = conts[:, t]
            values, counts = np.unique(col, return_counts=True)
            best = int(counts.argmax())
            token = int(values[best])
            prob *= counts[best] / len(col)
            if token < 0 or prob < min_prob:
                break
            out.append(token)
            conts = conts[col == token]
        return out


class SuffixProposer:
    def __init__(self, spec: SpeculativeConfig):
        self.k = spec.num_speculative_tokens
        self.depth = spec.suffix_decoding_max_tree_depth
        self.factor = spec.suffix_decoding_max_spec_factor
        self.min_prob = spec.suffix_decoding_min_token_prob
        self.cache = SuffixCache(spec.suffix_decoding_max_cached_requests, self.depth)
        self.histories = TokenHistories()

    def _max_len(self, match: int, limit: int) -> int:
        return min(limit, self.k, max(1, math.floor(self.factor * match)))

    def propose(self, reqs: list[Request], limits: list[int]) -> list[list[int]]:
        out = []
        for req, limit in zip(reqs, limits):
            ctx = self.histories.sync(req)
            own, own_ends = longest_suffix_match(ctx, 2, self.depth)
            glob, glob_ends = self.cache.lookup(ctx)
            if glob > own:
                out.append(self.cache.continue_from(glob_ends, self._max_len(glob, limit), self.min_prob))
            elif own:
                out.append(continuation(ctx, int(own_ends[-1]), self._max_len(own, limit)))
            else:
                out.append([])
        return out

    def finished(self, req: Request, completed: bool = True) -> None:
        """A request ended; a `completed` one's output joins the cache."""
        self.histories.drop(req)
        if completed:
            self.cache.add(req.output_token_ids)
