"""The BERT encoder family (BERT, MiniLM, all-MiniLM-L6-v2, bge/e5 BERT checkpoints) over a
flattened variable-length batch: every token of every sequence concatenated, no padding.

    h = LayerNorm(word[ids] + position[pos] + token_type[0])
    per layer (post-LN):
        a = attention(q, k, v) within each sequence, bidirectional (no causal mask)
        h = LayerNorm(h + dense(a))
        h = LayerNorm(h + out(act(inter(h))))

The hidden states of all tokens come back ([T, hidden]); pooling is engine/pooling.py's.

NOTE: attention runs per sequence (one `scaled_dot_product_attention` on [1, heads, L, d]
each, no mask): a sequence costs L^2, never the batch's longest squared, and no padded
token is ever computed. Sequences of the same length in one step share one call. On CUDA
this is the torch path too; the plan for a kernel is a varlen, non-causal variant of the
prefill attention in kernels/ (query_start_loc as the only layout), replacing the loop.

Refuses (never silently wrong): another position embedding type (relative_key...), a
decoder configuration (is_decoder / add_cross_attention), an activation not in ACTIVATIONS.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from inflight.engine.errors import ModelError

ENCODER_ARCHITECTURES = ("BertModel", "BertForMaskedLM", "BertForPreTraining", "BertForSequenceClassification")
ENCODER_MODEL_TYPES = ("bert",)
ACTIVATIONS = {"gelu": lambda x: F.gelu(x), "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
               "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"), "relu": F.relu}


def is_encoder_config(config: dict) -> bool:
    archs = config.get("architectures") or []
    return config.get("model_type") in ENCODER_MODEL_TYPES or any(a in ENCODER_ARCHITECTURES for a in archs)


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    activation: str

    @classmethod
    def from_folder(cls, folder: pathlib.Path) -> BertConfig:
        path = folder / "config.json"
        if not path.is_file():
            raise ModelError(f"{folder} has no config.json")
        c = json.loads(path.read_text())
        if not is_encoder_config(c):
            raise ModelError(f"{folder}/config.json is not a BERT encoder (model_type "
                             f"{c.get('model_type')!r}, architectures {c.get('architectures')})")
        for key, ok in (("position_embedding_type", (None, "absolute")), ("is_decoder", (None, False)),
                        ("add_cross_attention", (None, False))):
            if c.get(key) not in ok:
                raise ModelError(f"{folder}/config.json sets {key}={c.get(key)!r}, which the BERT "
                                 f"encoder does not implement (it runs {ok[1]!r})")
        act = c.get("hidden_act", "gelu")
        if act not in ACTIVATIONS:
            raise ModelError(f"{folder}/config.json hidden_act={act!r} is not one of {sorted(ACTIVATIONS)}")
        return cls(vocab_size=c["vocab_size"], hidden_size=c["hidden_size"],
                   num_layers=c["num_hidden_layers"], num_heads=c["num_attention_heads"],
                   intermediate_size=c["intermediate_size"],
                   max_position_embeddings=c.get("max_position_embeddings", 512),
                   type_vocab_size=c.get("type_vocab_size", 2),
                   layer_norm_eps=c.get("layer_norm_eps", 1e-12), activation=act)


@dataclass
class BertLayer:
    qkv_w: torch.Tensor   # [3H, H]  q|k|v fused
    qkv_b: torch.Tensor
    o_w: torch.Tensor
    o_b: torch.Tensor
    ln1_w: torch.Tensor
    ln1_b: torch.Tensor
    inter_w: torch.Tensor
    inter_b: torch.Tensor
    out_w: torch.Tensor
    out_b: torch.Tensor
    ln2_w: torch.Tensor
    ln2_b: torch.Tensor


class BertEncoder:
    """`forward(ids, positions, cu_seqlens)` -> last hidden states [T, hidden]."""

    is_encoder = True

    def __init__(self, folder: str | pathlib.Path, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu"):
        from safetensors.torch import load_file

        folder = pathlib.Path(folder)
        self.config = cfg = BertConfig.from_folder(folder)
        self.device = torch.device(device)
        self.dtype = dtype
        self.max_model_len = cfg.max_position_embeddings
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise ModelError(f"{folder} has no *.safetensors weights")
        raw: dict[str, torch.Tensor] = {}
        for f in files:
            raw.update(load_file(str(f)))
        # BertModel saves without a prefix; BertFor* under "bert."
        t = {k.removeprefix("bert."): v for k, v in raw.items()}

        def get(name: str) -> torch.Tensor:
            if name not in t:
                raise ModelError(f"{folder}: weight {name!r} is missing from the checkpoint")
            return t[name].to(device=self.device, dtype=dtype).contiguous()

        e = "embeddings."
        self.word = get(e + "word_embeddings.weight")
        self.position = get(e + "position_embeddings.weight")
        self.token_type = get(e + "token_type_embeddings.weight")
        self.emb_ln = (get(e + "LayerNorm.weight"), get(e + "LayerNorm.bias"))
        self.layers = []
        for i in range(cfg.num_layers):
            p = f"encoder.layer.{i}."
            a = p + "attention."
            self.layers.append(BertLayer(
                qkv_w=torch.cat([get(a + f"self.{n}.weight") for n in ("query", "key", "value")]),
                qkv_b=torch.cat([get(a + f"self.{n}.bias") for n in ("query", "key", "value")]),
                o_w=get(a + "output.dense.weight"), o_b=get(a + "output.dense.bias"),
                ln1_w=get(a + "output.LayerNorm.weight"), ln1_b=get(a + "output.LayerNorm.bias"),
                inter_w=get(p + "intermediate.dense.weight"), inter_b=get(p + "intermediate.dense.bias"),
                out_w=get(p + "output.dense.weight"), out_b=get(p + "output.dense.bias"),
                ln2_w=get(p + "output.LayerNorm.weight"), ln2_b=get(p + "output.LayerNorm.bias")))
        self.act = ACTIVATIONS[cfg.activation]
        self.head_dim = cfg.hidden_size // cfg.num_heads
        self.scale = self.head_dim ** -0.5

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, positions: torch.Tensor, lens: list[int]) -> torch.Tensor:
        """ids/positions [T] (sequence i is the next lens[i] tokens) -> hidden [T, hidden]."""
        c = self.config
        H, eps = c.hidden_size, c.layer_norm_eps
        h = self.word[ids] + self.position[positions] + self.token_type[0]
        h = F.layer_norm(h, (H,), *self.emb_ln, eps)
        groups = _length_groups(lens)
        for layer in self.layers:
            qkv = F.linear(h, layer.qkv_w, layer.qkv_b)
            a = self._attention(qkv, groups, h.shape[0])
            h = F.layer_norm(h + F.linear(a, layer.o_w, layer.o_b), (H,), layer.ln1_w, layer.ln1_b, eps)
            x = self.act(F.linear(h, layer.inter_w, layer.inter_b))
            h = F.layer_norm(h + F.linear(x, layer.out_w, layer.out_b), (H,), layer.ln2_w, layer.ln2_b, eps)
        return h

    def _attention(self, qkv: torch.Tensor, groups: list, T: int) -> torch.Tensor:
        """Bidirectional attention within each sequence; qkv [T, 3H] -> [T, H]."""
        nh, d = self.config.num_heads, self.head_dim
        H = nh * d
        out = torch.empty(T, H, dtype=qkv.dtype, device=qkv.device)
        for length, count, start, idx in groups:
            # one sequence, or same-length ones back to back: a view; else gathered rows
            x = qkv[start:start + length * count] if idx is None else qkv[idx]
            x = x.view(count, length, 3, nh, d)
            q, k, v = (x[:, :, j].transpose(1, 2) for j in range(3))  # [B, nh, L, d]
            o = F.scaled_dot_product_attention(q, k, v, scale=self.scale)
            o = o.transpose(1, 2).reshape(count * length, H)
            if idx is None:
                out[start:start + length * count] = o
            else:
                out[idx] = o
        return out


def _length_groups(lens: list[int]) -> list[tuple[int, int, int, torch.Tensor | None]]:
    """Per distinct sequence length, in first-seen order: (length, how many, the first
    one's start row, the rows of all of them when they are not back to back, else None).
    Worked out once per forward, read by every layer."""
    by_len: dict[int, list[int]] = {}
    start = 0
    for n in lens:
        by_len.setdefault(n, []).append(start)
        start += n
    groups = []
    for n, starts in by_len.items():
        together = all(b - a == n for a, b in zip(starts, starts[1:]))
        idx = None if together else \
            (torch.tensor(starts)[:, None] + torch.arange(n)[None, :]).reshape(-1)
        groups.append((n, len(starts), starts[0], idx))
    return groups
