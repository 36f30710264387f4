"""A tensor-parallel rank's model: the same decoder over its shard (engine/parallel/shard.py).

    embed       vocab-parallel: a rank looks up the ids in its vocabulary slice (zeros for
                the rest), one all-reduce sums them (exact: one rank contributes each row)
    attention   the rank's heads only; q/k/v column-parallel, o row-parallel + all-reduce
    MLP         gate/up column-parallel, down row-parallel + all-reduce
    LM head     vocab-parallel: each rank's logits slice, gathered on rank 0 in rank order

`ShardedModel` is what every rank computes; the followers (engine/parallel/worker_proc.py)
run it as told. `LeaderModel` is rank 0's, the one the model runner holds: every call the
runner makes (forward, forward_hidden, compute_logits, allocate_kv_cache) first tells the
followers to make the same call (engine/parallel/handoff.py), then makes it itself, so the
ranks meet in the same collectives in the same order.
"""

from __future__ import annotations

import json
import pathlib

import torch
import torch.nn.functional as F

from inflight.engine.config import DTYPES
from inflight.engine.model import AttentionMetadata, DecoderModel
from inflight.engine.model_config import ModelConfig
from inflight.engine.parallel import handoff
from inflight.engine.parallel.group import Group, TensorParallelError
from inflight.engine.parallel.shard import ShardPlan, read_shard
from inflight.kernels.kv_quant import KV_CACHE_DTYPES


class RowParallel:
    """A row-parallel projection: this rank's partial product, summed over the ranks."""

    def __init__(self, inner, group: Group):
        self.inner, self.group = inner, group

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.all_reduce(self.inner(x))


class ShardedModel(DecoderModel):
    def __init__(self, folder: str | pathlib.Path, ops, dtype: torch.dtype,
                 device: str | torch.device, max_model_len: int | None,
                 kv_dtype: torch.dtype | None = None, *, group: Group):
        self.group = group
        super().__init__(folder, ops, dtype, device, max_model_len, kv_dtype)
        for layer in self.layers:
            layer.o, layer.down = RowParallel(layer.o, group), RowParallel(layer.down, group)

    def read_checkpoint(self, folder: pathlib.Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
        full = ModelConfig.from_folder(folder)
        self.full_config = full
        self.plan = plan = ShardPlan.of(full, self.group.rank, self.group.world)
        return plan.local_config(full), read_shard(folder, plan)

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.group.world == 1:
            return super().embed_tokens(input_ids)
        n = self.plan.vocab_per_rank
        local = input_ids - self.plan.vocab_first
        inside = (local >= 0) & (local < n)
        h = F.embedding(torch.where(inside, local, 0), self.embed)
        h = self.group.all_reduce(h * inside[:, None].to(h.dtype))
        return h if self.embed_scale is None else h * self.embed_scale

    def compute_logits(self, h: torch.Tensor) -> torch.Tensor | None:
        """Final hidden states [R, hidden] -> fp32 logits [R, vocab] on rank 0, None on the
        others (they send their slices)."""
        logits = F.linear(h, self.lm_head)
        cap = self.config.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        logits = logits.float()
        if self.group.world == 1:
            return logits
        parts = self.group.gather(logits.contiguous())
        if parts is None:
            return None
        out = torch.cat(parts, dim=1)
        vocab = self.config.vocab_size
        return out if out.shape[1] == vocab else out[:, :vocab].contiguous()


class LeaderModel(ShardedModel):
    """Rank 0: each call is handed to the followers first (one message + at most one
    broadcast), then run here."""

    def __init__(self, folder: str | pathlib.Path, ops, dtype: torch.dtype,
                 device: str | torch.device, max_model_len: int | None,
                 kv_dtype: torch.dtype | None = None, *, tp):
        self.tp = tp
        self._hidden: torch.Tensor | None = None
        name = next(k for k, v in DTYPES.items() if v == dtype)
        kv_name = next((k for k, v in KV_CACHE_DTYPES.items() if v is not None and v == kv_dtype), "auto")
        spec = {"folder": str(pathlib.Path(folder).resolve()), "dtype": name,
                "max_model_len": max_model_len, "kernels": ops.name, "kv_cache_dtype": kv_name}
        tp.send(handoff.LOAD, extra=json.dumps(spec).encode())
        with tp.all_ranks(f"loading {folder}"):
            super().__init__(folder, ops, dtype, device, max_model_len, kv_dtype, group=tp.group)

    def allocate_kv_cache(self, num_blocks: int, block_size: int):
        self.tp.send(handoff.ALLOC, num_blocks, block_size)
        with self.tp.all_ranks(f"allocating {num_blocks} KV blocks"):
            caches = super().allocate_kv_cache(num_blocks, block_size)
        return caches

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv_caches, logits_indices: torch.Tensor) -> torch.Tensor:
        self._hand_off(handoff.FORWARD, input_ids, positions, meta, logits_indices)
        h = DecoderModel.forward_hidden(self, input_ids, positions, meta, kv_caches, logits_indices)
        return ShardedModel.compute_logits(self, h)

    def forward_hidden(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                       kv_caches, rows: torch.Tensor) -> torch.Tensor:
        self._hand_off(handoff.HIDDEN, input_ids, positions, meta, rows)
        self._hidden = h = super().forward_hidden(input_ids, positions, meta, kv_caches, rows)
        return h

    def compute_logits(self, h: torch.Tensor) -> torch.Tensor:
        if self.tp.followers:
            self.tp.send(handoff.LOGITS, self._first_row(h), h.shape[0])
        return super().compute_logits(h)

    def close(self) -> None:
        """Release the followers' shard (a group that outlives this engine) or the group."""
        self.tp.release()

    def _hand_off(self, cmd: int, input_ids, positions, meta, rows) -> None:
        if not self.tp.followers:
            return
        self.tp.send(cmd, *handoff.step_sizes(input_ids, meta, rows))
        self.tp.group.broadcast(handoff.pack_step(input_ids, positions, meta, rows))

    def _first_row(self, h: torch.Tensor) -> int:
        """Where `h` starts in the last forward_hidden's output (the followers hold theirs:
        a logits piece is named by its rows, not sent)."""
        base = self._hidden
        if base is not None and h.dim() == 2 and h.shape[1:] == base.shape[1:] and (
                h.shape[0] == 0 or (h.stride() == base.stride() and
                                    h.untyped_storage().data_ptr() == base.untyped_storage().data_ptr())):
            first, rem = divmod(h.storage_offset() - base.storage_offset(), base.stride(0))
            if h.shape[0] == 0:
                return 0
            if not rem and 0 <= first and first + h.shape[0] <= base.shape[0]:
                return first
        raise TensorParallelError("compute_logits on a tensor-parallel model takes rows of the last "
                                  "forward_hidden output (each rank holds its own copy of them)")
