"""The proposers on their own: n-gram lookup against a brute-force search, the suffix
cache's matches, its bound and its use across requests."""

from __future__ import annotations

import random

import numpy as np

from inflight.engine.request import Request
from inflight.engine.sampling_params import SamplingParams
from inflight.engine.spec.config import SpeculativeConfig
from inflight.engine.spec.ngram import NgramProposer, TokenHistory, longest_suffix_match, propose_ngram
from inflight.engine.spec.suffix import SuffixCache, SuffixProposer


def brute_force(tokens: list[int], n_min: int, n_max: int) -> tuple[int, list[int]]:
    L = len(tokens)
    for n in range(min(n_max, L - 1), n_min - 1, -1):
        suffix = tokens[L - n:]
        ends = [e for e in range(n - 1, L - 1) if tokens[e - n + 1:e + 1] == suffix]
        if ends:
            return n, ends
    return 0, []


def test_longest_suffix_match_equals_brute_force():
    rng = random.Random(0)
    for trial in range(300):
        vocab = rng.choice([2, 3, 5, 50])
        tokens = [rng.randrange(vocab) for _ in range(rng.randint(1, 60))]
        n_min, n_max = rng.choice([(1, 1), (1, 4), (2, 4), (3, 6)])
        n, ends = longest_suffix_match(np.asarray(tokens), n_min, n_max)
        assert (n, ends.tolist()) == brute_force(tokens, n_min, n_max), (tokens, n_min, n_max)


def test_ngram_drafts_what_followed_and_goes_around_a_loop():
    # "7 8 9" appeared before, followed by 1 2 3
    assert propose_ngram(np.asarray([7, 8, 9, 1, 2, 3, 4, 7, 8, 9]), 3, 2, 4) == [1, 2, 3]
    # the latest occurrence wins
    assert propose_ngram(np.asarray([7, 8, 5, 5, 7, 8, 6, 6, 7, 8]), 2, 2, 2) == [6, 6]
    # a loop a b c a b c a b: drafted as going on
    assert propose_ngram(np.asarray([1, 2, 3, 1, 2, 3, 1, 2]), 5, 2, 3) == [3, 1, 2, 3, 1]
    assert propose_ngram(np.asarray([1, 2, 3, 4]), 3, 1, 3) == []


def test_token_history_grows_by_new_tokens_only():
    h = TokenHistory(2)
    tokens = [1, 2, 3]
    assert h.sync(tokens).tolist() == [1, 2, 3]
    tokens += list(range(10, 500))
    assert h.sync(tokens).tolist() == tokens
    assert h.sync(tokens).tolist() == tokens


def test_ngram_proposer_limits_drafts_per_request():
    prop = NgramProposer(4, 1, 3)
    reqs = [Request(str(i), [5, 6, 7, 5, 6, 7, 5, 6], SamplingParams()) for i in range(2)]
    assert prop.propose(reqs, [4, 2]) == [[7, 5, 6, 7], [7, 5]]


def test_suffix_cache_matches_across_outputs_and_follows_the_majority():
    cache = SuffixCache(max_requests=10, max_depth=8)
    cache.add([1, 2, 3, 4, 5, 6])
    cache.add([9, 2, 3, 4, 5, 7])
    cache.add([8, 3, 4, 5, 7, 0])
    n, ends = cache.lookup(np.asarray([42, 2, 3, 4, 5]))
    assert n == 4 and len(ends) == 2                     # "2 3 4 5" twice; "3 4 5" is shorter
    assert cache.continue_from(ends, 4, 0.1) == [6]      # 6 or 7 at 1/2 each; then the output ends
    n, ends = cache.lookup(np.asarray([3, 4, 5]))
    assert n == 3 and cache.continue_from(ends, 4, 0.5) == [7]  # 7 in 2 of 3
    assert cache.continue_from(ends, 4, 0.9) == []


def test_suffix_cache_is_bounded_and_compacts():
    cache = SuffixCache(max_requests=3, max_depth=4)
    rng = random.Random(1)
    for i in range(200):
        cache.add([rng.randrange(50) for _ in range(20)] + [1000 + i, 2000 + i])
        assert cache.num_requests <= 3 and cache.size <= 2 * 3 * 23 + 23
    n, ends = cache.lookup(np.asarray([1000 + 199, 2000 + 199]))
    assert n == 0                                        # nothing follows an output's last pair
    n, _ = cache.lookup(np.asarray([1000 + 150, 2000 + 150]))
    assert n == 0                                        # evicted
    assert sum(len(v) for v in cache.index.values()) <= 2 * 3 * 21 + 21  # dead ones until compaction


def test_suffix_proposer_drafts_from_another_requests_output():
    spec = SpeculativeConfig(method="suffix", num_speculative_tokens=8)
    prop = SuffixProposer(spec)
    first = Request("a", [50, 51, 52], SamplingParams())
    first.output_token_ids = [10, 11, 12, 13, 14, 15, 16, 17, 18]
    prop.finished(first)
    second = Request("b", [60, 61, 10, 11, 12], SamplingParams())
    assert prop.propose([second], [8]) == [[13, 14, 15]]  # 3 = max_spec_factor (1) x match (3)
    second.all_token_ids += [13, 14, 15]
    assert prop.propose([second], [3]) == [[16, 17, 18]]
