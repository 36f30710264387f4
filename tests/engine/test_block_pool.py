"""Block pool and prefix hashing: chained hashes, LRU eviction, and invariants under random
add / step / abort / finish sequences (a hypothesis state machine that also checks what a
prefix hit reads is what was written)."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from inflight.engine.block_pool import BlockPool, hash_block
from inflight.engine.kv_cache_manager import KVCacheManager
from inflight.engine.request import Request
from inflight.engine.sampling_params import SamplingParams


def test_hash_chains_over_parent_tokens_and_extra_keys():
    a, b = hash_block(None, [1, 2, 3]), hash_block(None, [1, 2, 4])
    assert a != b and a == hash_block(None, [1, 2, 3])
    assert hash_block(a, [7, 7, 7]) != hash_block(b, [7, 7, 7])  # same tokens, other parent
    assert hash_block(a, [7, 7, 7]) != hash_block(a, [7, 7, 7], ("adapter-1",))


def test_allocation_prefers_clean_blocks_then_lru():
    pool = BlockPool(4)
    b = pool.allocate(3)
    for i, blk in enumerate(b):
        pool.cache_block(blk, hash_block(None, [i]))
    pool.free(b[::-1])  # tail first: b2 is the oldest free cached block
    assert pool.num_free_blocks == 4 and pool.num_cached_blocks == 3
    assert pool.allocate(1)[0].block_id == 3  # the never-used block first
    assert pool.num_evictions == 0
    assert pool.allocate(1)[0].block_id == b[2].block_id  # then the LRU cached block
    assert pool.num_evictions == 1 and pool.lookup(hash_block(None, [2])) is None
    assert pool.lookup(hash_block(None, [0])) is b[0]
    pool.touch([b[0]])  # a prefix hit revives a free cached block without a copy
    assert b[0].ref_cnt == 1 and pool.num_free_blocks == 1
    pool.check_invariants()


BS = 4
PREFIXES = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 9, 9, 9, 9], [5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5]]


class PoolMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.kv = KVCacheManager(num_blocks=24, block_size=BS, enable_caching=True)
        self.running: list[Request] = []
        self.content: dict[int, int] = {}  # slot -> token id whose K/V it holds
        self.n = 0

    def _slot(self, req, pos):
        return req.block_ids[pos // BS] * BS + pos % BS

    def _compute(self, req, upto):
        """Pretend to run the model: write req's tokens [computed, upto) into their slots."""
        for pos in range(req.num_computed_tokens, upto):
            block = self.kv.blocks_of(req)[pos // BS]
            assert block.ref_cnt == 1, "writing into a shared block"
            assert block.block_hash is None, "writing into a cached block"
            self.content[self._slot(req, pos)] = req.all_token_ids[pos]
        req.num_computed_tokens = upto
        self.kv.cache_full_blocks(req)

    @rule(prefix=st.sampled_from(PREFIXES), suffix=st.lists(st.integers(10, 13), max_size=6))
    def add(self, prefix, suffix):
        self.n += 1
        req = Request(f"r{self.n}", prefix + suffix, SamplingParams(max_tokens=8), arrival_index=self.n)
        cached, n_cached = self.kv.find_cached_prefix(req)
        assert n_cached < req.num_tokens
        if not self.kv.allocate_slots(req, req.num_tokens - n_cached, cached):
            return
        for pos in range(n_cached):  # a hit must read exactly the tokens it stands for
            assert self.content[self._slot(req, pos)] == req.all_token_ids[pos]
        self.running.append(req)
        self._compute(req, req.num_tokens)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100), token=st.integers(10, 13))
    def decode(self, i, token):
        req = self.running[i % len(self.running)]
        req.output_token_ids.append(token)  # a sampled token, as Engine._accept_token adds it
        req.all_token_ids.append(token)
        if not self.kv.allocate_slots(req, 1):
            self.kv.free(req)  # out of blocks: preempt
            self.running.remove(req)
            return
        self._compute(req, req.num_tokens)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100))
    def finish_or_abort(self, i):
        req = self.running.pop(i % len(self.running))
        self.kv.free(req)

    @invariant()
    def pool_consistent(self):
        self.kv.check_invariants(self.running)
        holders: dict[int, list[tuple[Request, int]]] = {}
        for req in self.running:
            for idx, b in enumerate(req.block_ids):
                holders.setdefault(b, []).append((req, idx))
        for b, hs in holders.items():
            if len(hs) > 1:  # shared: full, cached, and computed by every holder
                assert self.kv.pool.blocks[b].block_hash is not None
                assert all(r.num_computed_tokens >= (idx + 1) * BS for r, idx in hs)


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
