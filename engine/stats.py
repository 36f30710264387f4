"""Engine counters and the `Engine.stats()` snapshot."""

from __future__ import annotations

from dataclasses import dataclass

from inflight.engine.kv_cache_manager import KVCacheManager
from inflight.engine.scheduler import Scheduler


@dataclass
class EngineStats:
    steps: int = 0
    prefill_tokens: int = 0       # tokens computed for prompts (and recomputes), all steps
    decode_tokens: int = 0
    last_prefill_tokens: int = 0  # of the last step
    last_decode_tokens: int = 0
    last_batch_size: int = 0
    generated_tokens: int = 0

    def record_step(self, total_tokens: int, decode: int, batch_size: int, num_sampled: int) -> None:
        prefill = total_tokens - decode
        self.steps += 1
        self.prefill_tokens += prefill
        self.decode_tokens += decode
        self.last_prefill_tokens, self.last_decode_tokens = prefill, decode
        self.last_batch_size = batch_size
        self.generated_tokens += num_sampled

    def snapshot(self, kv: KVCacheManager, sched: Scheduler) -> dict:
        bs = kv.block_size
        filled: dict[int, int] = {}  # block id -> slots holding computed tokens
        for req in sched.running:
            for i, block_id in enumerate(req.block_ids):
                n = min(bs, max(0, req.num_computed_tokens - i * bs))
                if n > filled.get(block_id, 0):
                    filled[block_id] = n
        used = kv.pool.num_used_blocks
        stored = sum(filled.values())
        queried, hits = kv.num_queried_tokens, kv.num_hit_tokens
        return {
            "running": len(sched.running),
            "waiting": sched.num_waiting,
            "preemptions": sched.num_preemptions,
            "kv_blocks_total": kv.num_blocks,
            "kv_blocks_used": used,
            "kv_tokens_stored": stored,
            "kv_waste": (1.0 - stored / (used * bs)) if used else 0.0,
            "steps": self.steps,
            "prefill_tokens": self.prefill_tokens,
            "decode_tokens": self.decode_tokens,
            "generated_tokens": self.generated_tokens,
            "last_step_prefill_tokens": self.last_prefill_tokens,
            "last_step_decode_tokens": self.last_decode_tokens,
            "last_step_batch_size": self.last_batch_size,
            "prefix_cache_queries": queried,
            "prefix_cache_hit_tokens": hits,
            "prefix_cache_hit_rate": hits / queried if queried else 0.0,
            "prefix_cache_blocks": kv.pool.num_cached_blocks,
            "prefix_cache_evictions": kv.pool.num_evictions,
        }
