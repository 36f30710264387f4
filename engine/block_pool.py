"""The pool of KV blocks: allocation, reference counts, the prefix-hash map and eviction.

Every block is in exactly one of three states:

    in use       ref_cnt > 0, owned by one or more requests' block tables
    free, clean  ref_cnt == 0, no hash: holds nothing worth keeping (`_clean`, a stack)
    free, cached ref_cnt == 0, has a hash: still findable by prefix (`_lru`, oldest first)

Allocation takes clean blocks first, then evicts the least recently freed cached block
(dropping its hash entry). A prefix hit on a free cached block takes it back out of the
LRU queue without a copy. `_lru` is an OrderedDict: a C linked list with O(1) removal.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import NewType, Sequence

from array import array

BlockHash = NewType("BlockHash", bytes)


def hash_block(parent: BlockHash | None, token_ids: Sequence[int], extra_keys: tuple = ()) -> BlockHash:
    """Identity of one full block: chained from its parent's hash, its tokens and anything
    else that changes its K/V (the model at the root, adapter ids in `extra_keys`)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(parent or b"root")
    h.update(array("q", token_ids).tobytes())
    if extra_keys:
        h.update(repr(extra_keys).encode())
    return BlockHash(h.digest())


@dataclass(slots=True)
class KVCacheBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool = True):
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        # NOTE: reversed so that pop() hands out block 0 first.
        self._clean: list[int] = list(range(num_blocks - 1, -1, -1))
        self._lru: OrderedDict[int, None] = OrderedDict()
        self._cached: dict[BlockHash, int] = {}
        self.num_evictions = 0

    # -- queries ----------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._clean) + len(self._lru)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def lookup(self, block_hash: BlockHash) -> KVCacheBlock | None:
        block_id = self._cached.get(block_hash)
        return None if block_id is None else self.blocks[block_id]

    # -- allocation -------------------------------------------------------------------
    def allocate(self, n: int) -> list[KVCacheBlock]:
        """Take `n` free blocks (ref_cnt 1). The caller checks `num_free_blocks` first."""
        if n > self.num_free_blocks:
            raise RuntimeError(f"allocate({n}) with only {self.num_free_blocks} free blocks")
        out = []
        for _ in range(n):
            if self._clean:
                block = self.blocks[self._clean.pop()]
            else:
                block_id, _ = self._lru.popitem(last=False)
                block = self.blocks[block_id]
                del self._cached[block.block_hash]
                block.block_hash = None
                self.num_evictions += 1
            block.ref_cnt = 1
            out.append(block)
        return out

    def touch(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Take one more reference on each (prefix-hit) block; free ones leave the LRU queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._lru[block.block_id]
            block.ref_cnt += 1

    def free(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Drop one reference on each block, in the order given. NOTE: callers pass a block
        table tail-first, so a chain's tail is evicted before its shared head."""
        for block in blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if block.block_hash is None:
                    self._clean.append(block.block_id)
                else:
                    self._lru[block.block_id] = None

    def cache_block(self, block: KVCacheBlock, block_hash: BlockHash) -> None:
        """Make a full, in-use block findable by its hash. If an equal block is already
        cached (two requests computed the same prefix at once) the first one stays."""
        if not self.enable_caching or block.block_hash is not None:
            return
        if block_hash in self._cached:
            return
        block.block_hash = block_hash
        self._cached[block_hash] = block.block_id

    # -- invariants ------------------------------------------------------------------
    def check_invariants(self, expected_refs: dict[int, int] | None = None) -> None:
        """Raise AssertionError if the pool is inconsistent. `expected_refs` maps block id
        to the number of block tables that hold it (blocks absent from it must be free)."""
        clean, lru = set(self._clean), set(self._lru)
        if len(clean) != len(self._clean):
            raise AssertionError("a block is twice in the clean free list")
        if clean & lru:
            raise AssertionError(f"blocks both clean and cached-free: {sorted(clean & lru)}")
        for block in self.blocks:
            free = block.block_id in clean or block.block_id in lru
            if free == (block.ref_cnt > 0):
                raise AssertionError(f"block {block.block_id}: ref_cnt={block.ref_cnt} but "
                                     f"free={free}")
            if block.ref_cnt < 0:
                raise AssertionError(f"block {block.block_id}: negative ref_cnt")
            if block.block_id in clean and block.block_hash is not None:
                raise AssertionError(f"block {block.block_id}: clean but hashed")
            if block.block_id in lru and block.block_hash is None:
                raise AssertionError(f"block {block.block_id}: in LRU but has no hash")
            if block.block_hash is not None and self._cached.get(block.block_hash) != block.block_id:
                raise AssertionError(f"block {block.block_id}: hash not mapped to it")
            if expected_refs is not None and expected_refs.get(block.block_id, 0) != block.ref_cnt:
                raise AssertionError(f"block {block.block_id}: ref_cnt={block.ref_cnt}, held by "
                                     f"{expected_refs.get(block.block_id, 0)} block tables")
        if len(self._cached) != sum(b.block_hash is not None for b in self.blocks):
            raise AssertionError("hash map and block hashes disagree")
