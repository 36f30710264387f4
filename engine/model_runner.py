"""Turn a SchedulerOutput into tensors, run one forward pass, sample.

The flattened batch of one step (B requests, T tokens):

    input_ids/positions/slot_mapping  [T]     request 0's tokens | request 1's | ...
    query_start_loc                   [B+1]   where each request's tokens start in T
    seq_lens                          [B]     computed tokens after this step
    block_tables                      [B, M]  padded with 0 (never read past seq_len)
    logits_indices                    [S]     last row of each request that samples now

A request samples when this step brings its computed tokens up to all its tokens (the end
of a prefill, or a decode); a mid-prompt prefill chunk samples nothing.
"""

from __future__ import annotations

import torch

from engine.model import AttentionMetadata, LlamaModel
from engine.request import Request
from engine.sampler import SamplingBatch, sample
from engine.scheduler import SchedulerOutput


class ModelRunner:
    def __init__(self, model: LlamaModel, num_blocks: int, block_size: int, seed: int):
        self.model = model
        self.block_size = block_size
        self.device = model.device
        self.kv_caches = model.allocate_kv_cache(num_blocks, block_size)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput) -> tuple[list[Request], list[int]]:
        """Run one step; return the requests that sampled and their new token ids."""
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_start = [0]
        seq_lens: list[int] = []
        logits_rows: list[int] = []
        samplers: list[Request] = []
        for req, n in zip(sched.requests, sched.num_tokens):
            start, end = req.num_computed_tokens, req.num_computed_tokens + n
            input_ids += req.all_token_ids[start:end]
            positions += range(start, end)
            table = req.block_ids
            slots += [table[p // bs] * bs + p % bs for p in range(start, end)]
            query_start.append(query_start[-1] + n)
            seq_lens.append(end)
            if end == req.num_tokens:
                logits_rows.append(query_start[-1] - 1)
                samplers.append(req)
        width = max(len(r.block_ids) for r in sched.requests)
        tables = [r.block_ids + [0] * (width - len(r.block_ids)) for r in sched.requests]

        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            block_tables=torch.tensor(tables, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            query_start_loc=torch.tensor(query_start, dtype=torch.int32, device=dev),
        )
        if not samplers:
            # still run the pass: it writes this chunk's K/V into the cache
            logits_rows = [0]
        logits = self.model.forward(torch.tensor(input_ids, dtype=torch.int64, device=dev),
                                    torch.tensor(positions, dtype=torch.int64, device=dev), meta,
                                    self.kv_caches, torch.tensor(logits_rows, dtype=torch.int64, device=dev))
        if not samplers:
            return [], []
        tokens = sample(logits, self._sampling_batch(samplers, logits.shape[-1]), self.generator)
        return samplers, tokens.tolist()

    def _sampling_batch(self, reqs: list[Request], vocab: int) -> SamplingBatch:
        params = [r.params for r in reqs]
        all_greedy = all(p.greedy for p in params)
        if all_greedy:
            return SamplingBatch(torch.empty(0), None, None, [], True)
        dev = self.device
        use_k = any(p.uses_top_k for p in params)
        use_p = any(p.uses_top_p for p in params)
        return SamplingBatch(
            temperature=torch.tensor([p.temperature for p in params], dtype=torch.float32, device=dev),
            top_k=torch.tensor([p.top_k if p.uses_top_k else vocab for p in params], device=dev) if use_k else None,
            top_p=torch.tensor([p.top_p for p in params], dtype=torch.float32, device=dev) if use_p else None,
            generators=[r.generator for r in reqs],
            all_greedy=False,
        )
