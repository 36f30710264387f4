"""Which part of each checkpoint tensor a tensor-parallel rank holds (Megatron's layout).

    q/k/v, gate/up     column-parallel: the rank's output rows (its heads / its MLP slice)
    o, down            row-parallel: the rank's input columns; the partial sums are added
                       by one all-reduce after each (a bias is added once: rank 0 keeps it)
    embed, lm_head     vocab-parallel: rows [rank * Vr, (rank + 1) * Vr), Vr = ceil(V / world),
                       zero-padded at the end of the vocabulary
    norms              replicated (Qwen3 / Gemma 3 q/k norms are one head_dim vector, shared
                       by every head: replicated too)

Attention heads: rank r holds query heads [r * H/w, (r + 1) * H/w). Its KV heads are the
ones those queries read: kv/w of them when there are at least as many KV heads as ranks,
else the single head r // (w / kv) (replicated on w / kv ranks). Phi-3's fused qkv_proj
(q | k | v rows) and gate_up_proj (gate | up rows) are cut per part, then fused again.

Quantized projections (engine/quant): w8 `qweight` [N, K] int8 with `scales` [N]; w4
`qweight` [N, K/2] (two values per byte along K), `scales` / `qzeros` [N, K/g]. Rows cut
like dense weights; a row-parallel cut of K keeps whole groups (K/w a multiple of g) and
whole bytes, and w8's per-row scales stay whole.

Tensors are read from disk slice by slice (safetensors' lazy slices): a rank never holds
more of the checkpoint in host memory than its share (plus one replicated tensor).
"""

from __future__ import annotations

import dataclasses
import pathlib
from dataclasses import dataclass

import torch

from inflight.engine.errors import ConfigError, ModelError
from inflight.engine.model_config import ModelConfig

COLUMN_Q = ("q_proj",)
COLUMN_KV = ("k_proj", "v_proj")
COLUMN_MLP = ("gate_proj", "up_proj")
ROW = ("o_proj", "down_proj")
VOCAB = ("embed_tokens.weight", "lm_head.weight")


@dataclass(frozen=True)
class ShardPlan:
    """The slices of rank `rank` of `world` for one model."""

    rank: int
    world: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    group_size: int | None = None   # w4 checkpoints: the K-group of the scales

    @classmethod
    def of(cls, cfg: ModelConfig, rank: int, world: int) -> "ShardPlan":
        q = cfg.quantization
        plan = cls(rank, world, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size,
                   cfg.vocab_size, q.group_size if q is not None and q.scheme == "w4" else None)
        plan.check()
        return plan

    def check(self) -> None:
        w, h, kv = self.world, self.num_heads, self.num_kv_heads
        fix = "use a tensor_parallel_size that divides it"
        if h % w:
            raise ConfigError(f"tensor_parallel_size={w} does not divide num_attention_heads={h}: {fix}")
        if kv >= w and kv % w:
            raise ConfigError(f"tensor_parallel_size={w} does not divide num_key_value_heads={kv}: {fix}")
        if kv < w and w % kv:
            raise ConfigError(f"num_key_value_heads={kv} does not divide tensor_parallel_size={w}: "
                              "with fewer KV heads than ranks each KV head is replicated on "
                              "tensor_parallel_size / num_key_value_heads ranks")
        if self.intermediate_size % w:
            raise ConfigError(f"tensor_parallel_size={w} does not divide intermediate_size="
                              f"{self.intermediate_size}: {fix}")
        g = self.group_size
        if g is not None:
            for name, k in (("o_proj", self.q_cols[1] - self.q_cols[0]),
                            ("down_proj", self.intermediate_size // w)):
                if k % g:
                    raise ConfigError(f"tensor_parallel_size={w} cuts {name}'s K into {k}-column "
                                      f"shards, not whole w4 groups of {g}: quantize with a "
                                      f"group size that divides {k}, or use another size")

    # -- the slices ------------------------------------------------------------------------
    @property
    def heads(self) -> int:
        return self.num_heads // self.world

    @property
    def kv_heads(self) -> int:
        return max(1, self.num_kv_heads // self.world)

    @property
    def kv_first(self) -> int:
        kv, w = self.num_kv_heads, self.world
        return self.rank * kv // w if kv >= w else self.rank // (w // kv)

    @property
    def q_cols(self) -> tuple[int, int]:
        """This rank's slice of q's output rows (= o_proj's input columns)."""
        n = self.heads * self.head_dim
        return self.rank * n, (self.rank + 1) * n

    @property
    def kv_rows(self) -> tuple[int, int]:
        a = self.kv_first * self.head_dim
        return a, a + self.kv_heads * self.head_dim

    @property
    def mlp_rows(self) -> tuple[int, int]:
        n = self.intermediate_size // self.world
        return self.rank * n, (self.rank + 1) * n

    @property
    def vocab_per_rank(self) -> int:
        return -(-self.vocab_size // self.world)

    @property
    def vocab_first(self) -> int:
        return self.rank * self.vocab_per_rank

    def local_config(self, cfg: ModelConfig) -> ModelConfig:
        """The config the rank's forward runs: its heads and MLP width; the vocabulary stays
        the model's (the LM head's shards are gathered before sampling)."""
        return dataclasses.replace(cfg, num_heads=self.heads, num_kv_heads=self.kv_heads,
                                   intermediate_size=self.intermediate_size // self.world)

    # -- per tensor --------------------------------------------------------------------------
    def take(self, name: str, sl, shape: list[int]) -> torch.Tensor:
        """This rank's part of checkpoint tensor `name` (`sl`: a safetensors slice)."""
        bare = name[len("model."):] if name.startswith("model.") else name
        if bare in VOCAB:
            return self._vocab(sl, shape)
        parts = bare.split(".")
        if len(parts) < 3 or parts[0] != "layers":
            return sl[:]
        proj, kind = parts[-2], parts[-1]
        q0, q1 = self.q_cols
        k0, k1 = self.kv_rows
        m0, m1 = self.mlp_rows
        if proj in COLUMN_Q:
            return sl[q0:q1]
        if proj in COLUMN_KV:
            return sl[k0:k1]
        if proj in COLUMN_MLP:
            return sl[m0:m1]
        if proj == "qkv_proj":  # Phi-3: q | k | v rows
            q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
            return torch.cat([sl[q0:q1], sl[q + k0:q + k1], sl[q + kv + k0:q + kv + k1]])
        if proj == "gate_up_proj":  # Phi-3: gate | up rows
            i = self.intermediate_size
            return torch.cat([sl[m0:m1], sl[i + m0:i + m1]])
        if proj in ROW:
            a, b = (q0, q1) if proj == "o_proj" else (m0, m1)
            return self._row_parallel(name, kind, sl, shape, a, b)
        return sl[:]

    def _row_parallel(self, name: str, kind: str, sl, shape: list[int], a: int, b: int) -> torch.Tensor:
        if kind == "bias":  # added once, after the all-reduce's sum: rank 0's
            t = sl[:]
            return t if self.rank == 0 else torch.zeros_like(t)
        if kind == "weight" or (kind == "qweight" and self.group_size is None):  # dense, w8
            return sl[:, a:b]
        if kind == "scales" and self.group_size is None:  # w8: one scale per output row
            return sl[:]
        if kind == "qweight":  # w4: two values per byte along K
            return sl[:, a // 2:b // 2]
        if kind in ("scales", "qzeros"):  # w4: one per K-group
            g = self.group_size
            return sl[:, a // g:b // g]
        raise ModelError(f"tensor {name!r} of shape {shape} has no tensor-parallel layout")

    def _vocab(self, sl, shape: list[int]) -> torch.Tensor:
        a = self.vocab_first
        b = min(a + self.vocab_per_rank, shape[0])
        t = sl[a:b] if a < b else None
        pad = self.vocab_per_rank - (b - a if t is not None else 0)
        if t is None:
            return torch.zeros([self.vocab_per_rank, *shape[1:]])
        if pad:  # rows past the vocabulary: never looked up, their logits cut off
            t = torch.cat([t, t.new_zeros([pad, *shape[1:]])])
        return t


def read_shard(folder: pathlib.Path, plan: ShardPlan) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's safetensors files, cut to this rank's part."""
    from safetensors import safe_open

    files = sorted(pathlib.Path(folder).glob("*.safetensors"))
    if not files:
        raise ModelError(f"{folder} has no *.safetensors weights")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():
                sl = st.get_slice(name)
                out[name] = plan.take(name, sl, list(sl.get_shape())).contiguous()
    return out
