"""Per-request KV bookkeeping on top of the BlockPool: prefix lookup, slot allocation, freeing.

It owns each request's blocks (`KVCacheBlock`s, by request id, as vLLM's `req_to_blocks`)
and how many of them are findable in the prefix cache; a request keeps only what the
rest of the engine reads: its block ids (the block table) and its blocks' hashes.
The scheduler asks two questions of it and never touches blocks itself:

    find_cached_prefix(req)   -> the leading blocks of req already in the cache
    allocate_slots(req, n, …) -> room for n more tokens (False: out of blocks, preempt)

NOTE: block tables are append-only while a request runs, but for one thing: after a
speculative verification `trim` frees the tail blocks that hold only rejected drafts
(never a shared or cached block: those hold computed, verified tokens only). Only full
blocks are ever shared, and a request writes only at positions >= num_computed_tokens,
which lie in its private blocks, so two requests never write into a shared block.
"""

from __future__ import annotations

from typing import Sequence

from inflight.engine.block_pool import BlockHash, BlockPool, KVCacheBlock, hash_block
from inflight.engine.request import Request


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True,
                 root_hash: bytes = b""):
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.pool = BlockPool(num_blocks, enable_caching)
        self.root_hash = BlockHash(root_hash or b"root")
        self.num_queried_tokens = 0
        self.num_hit_tokens = 0
        self._blocks: dict[str, list[KVCacheBlock]] = {}  # request id -> its blocks, in order
        self._registered: dict[str, int] = {}  # request id -> leading blocks made findable

    def blocks_of(self, req: Request) -> list[KVCacheBlock]:
        """req's blocks, in block-table order (empty when it holds none)."""
        return self._blocks.get(req.request_id, [])

    def num_registered_blocks(self, req: Request) -> int:
        """req's leading blocks already made findable in the prefix cache."""
        return self._registered.get(req.request_id, 0)

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- prefix cache -----------------------------------------------------------------
    def _update_hashes(self, req: Request) -> None:
        """Extend req.block_hashes over every full block of its tokens."""
        bs, tokens, hashes = self.block_size, req.all_token_ids, req.block_hashes
        for i in range(len(hashes), len(tokens) // bs):
            parent = hashes[-1] if hashes else self.root_hash
            hashes.append(hash_block(parent, tokens[i * bs:(i + 1) * bs], req.extra_keys))

    def find_cached_prefix(self, req: Request) -> tuple[list[KVCacheBlock], int]:
        """The longest run of req's leading full blocks that is cached, and its token count.
        NOTE: stops one token short of the end: the last token is always recomputed, since
        its logits are needed (a fully cached prompt recomputes its whole last block).
        A request that still needs prompt logprobs gets no hits (it needs every logit)."""
        if not self.enable_caching or req.needs_prompt_logprobs:
            return [], 0
        self._update_hashes(req)
        max_blocks = (req.num_tokens - 1) // self.block_size
        hits = []
        for block_hash in req.block_hashes[:max_blocks]:
            block = self.pool.lookup(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    def hashes_in_flight(self, requests: Sequence[Request]) -> set[BlockHash]:
        """Hashes of the full blocks these requests have still to compute, or computed by a
        step whose result is not read yet (with overlapped outputs blocks are registered a
        step after they are computed: engine.Engine._cache_completed)."""
        if not self.enable_caching:
            return set()
        out: set[BlockHash] = set()
        bs = self.block_size
        for req in requests:
            registered = self.num_registered_blocks(req)
            first = min(registered, req.num_computed_tokens // bs)
            if req.num_tokens - req.num_computed_tokens > bs or \
                    req.num_computed_tokens // bs > registered:
                self._update_hashes(req)
                out.update(req.block_hashes[first:])
        return out

    def next_block_in(self, req: Request, num_hit_blocks: int, hashes: set[BlockHash]) -> bool:
        """Is the first block req would compute (after its cache hits) among `hashes`?"""
        return bool(hashes) and num_hit_blocks < len(req.block_hashes) and \
            req.block_hashes[num_hit_blocks] in hashes

    def record_prefix_query(self, num_tokens: int, num_hit_tokens: int) -> None:
        self.num_queried_tokens += num_tokens
        self.num_hit_tokens += num_hit_tokens

    def cache_full_blocks(self, req: Request, num_tokens: int | None = None) -> None:
        """Make req's newly computed full blocks findable: those within its first
        `num_tokens` tokens (default: all computed ones), which must be written already."""
        if not self.enable_caching:
            return
        done = req.num_computed_tokens if num_tokens is None else min(num_tokens, req.num_computed_tokens)
        n_full = done // self.block_size
        registered = self.num_registered_blocks(req)
        if n_full <= registered:
            return
        self._update_hashes(req)
        blocks = self._blocks[req.request_id]
        for i in range(registered, n_full):
            self.pool.cache_block(blocks[i], req.block_hashes[i])
        self._registered[req.request_id] = n_full

    def cache_completed(self, requests: Sequence[Request], seq_lens: Sequence[int]) -> None:
        """cache_full_blocks for each unfinished request of a completed step, up to its
        computed tokens there; those that filled no new block cost one comparison."""
        bs, registered = self.block_size, self._registered
        for req, done in zip(requests, seq_lens):
            if min(done, req.num_computed_tokens) // bs > registered.get(req.request_id, 0) \
                    and not req.is_finished:
                self.cache_full_blocks(req, done)

    # -- allocation -------------------------------------------------------------------
    def can_fit(self, req: Request, num_new_tokens: int,
                cached: Sequence[KVCacheBlock] = ()) -> bool:
        held = len(req.block_ids) + len(cached)
        computed = req.num_computed_tokens + len(cached) * self.block_size
        need = self.blocks_for(computed + num_new_tokens) - held
        # cached blocks that are free right now leave the free queue when reused
        need += sum(1 for b in cached if b.ref_cnt == 0)
        return need <= self.pool.num_free_blocks

    def allocate_slots(self, req: Request, num_new_tokens: int,
                       cached: Sequence[KVCacheBlock] = ()) -> bool:
        """Give req room for `num_new_tokens` more tokens after its computed ones, first
        adopting `cached` prefix blocks (only when req holds no blocks yet). Returns False,
        changing nothing, when the pool is short."""
        if cached:
            assert not req.block_ids and req.num_computed_tokens == 0
        elif req.num_computed_tokens + num_new_tokens <= len(req.block_ids) * self.block_size:
            return True  # room in the blocks it holds (most decode steps)
        if not self.can_fit(req, num_new_tokens, cached):
            return False
        blocks = self._blocks.setdefault(req.request_id, [])
        if cached:
            self.pool.touch(cached)
            blocks.extend(cached)
            req.block_ids.extend(b.block_id for b in cached)
            req.num_computed_tokens = len(cached) * self.block_size
            self._registered[req.request_id] = len(cached)
        need = self.blocks_for(req.num_computed_tokens + num_new_tokens) - len(blocks)
        if need > 0:
            new = self.pool.allocate(need)
            blocks.extend(new)
            req.block_ids.extend(b.block_id for b in new)
        return True

    def trim(self, req: Request) -> None:
        """Free req's tail blocks past its computed tokens (they hold only rejected drafts)."""
        keep = self.blocks_for(req.num_computed_tokens)
        blocks = self._blocks.get(req.request_id)
        if blocks is not None and len(blocks) > keep:
            self.pool.free(blocks[keep:][::-1])
            del blocks[keep:]
            del req.block_ids[keep:]

    def free(self, req: Request) -> None:
        """Release all of req's blocks, tail first, and forget its progress."""
        blocks = self._blocks.pop(req.request_id, None)
        if blocks:
            self.pool.free(blocks[::-1])
        self._registered.pop(req.request_id, None)
        req.block_ids.clear()
        req.num_computed_tokens = 0

    def check_invariants(self, requests: Sequence[Request]) -> None:
        refs: dict[int, int] = {}
        leaked = set(self._blocks).difference(r.request_id for r in requests)
        if leaked:
            raise AssertionError(f"blocks held for requests that are gone: {sorted(leaked)}")
        for req in requests:
            if len(set(req.block_ids)) != len(req.block_ids):
                raise AssertionError(f"{req.request_id} holds a block twice")
            if [b.block_id for b in self.blocks_of(req)] != req.block_ids:
                raise AssertionError(f"{req.request_id}'s block table is not its blocks")
            for block_id in req.block_ids:
                refs[block_id] = refs.get(block_id, 0) + 1
        self.pool.check_invariants(refs)
