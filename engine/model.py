"""Llama-family decoder (Llama, Mistral, Qwen2, SmolLM) over a flattened, paged batch.

One forward takes every scheduled token of every sequence concatenated (no padding); the
layer math calls only the `KernelOps` it was given, so the Triton kernels slot in. Weights
come from a Hugging Face folder: q/k/v and gate/up are fused at load time.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from inflight.engine.quant.config import QuantConfig, read_quant_config
from inflight.engine.quant.linear import Linear, load_linear
from inflight.kernels.ops import KernelOps
from inflight.kernels.rotary import rope_cos_sin
from inflight.engine.errors import ModelError

SUPPORTED_ARCHS = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    quantization: QuantConfig | None = None

    @classmethod
    def from_folder(cls, folder: pathlib.Path) -> "ModelConfig":
        path = folder / "config.json"
        if not path.is_file():
            raise ModelError(f"{folder} has no config.json: point EngineConfig.model at a "
                             "Hugging Face model folder (config.json, *.safetensors, tokenizer.json)")
        c = json.loads(path.read_text())
        arch = (c.get("architectures") or ["?"])[0]
        if arch not in SUPPORTED_ARCHS:
            raise ModelError(f"{folder}: architecture {arch!r} is not supported; the engine "
                             f"runs {', '.join(SUPPORTED_ARCHS)}")
        rope = c.get("rope_parameters") or {}
        scaling = c.get("rope_scaling") or {}
        rope_type = rope.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
        if rope_type != "default":
            raise ModelError(f"{folder}: rope type {rope_type!r} is not supported (only plain RoPE)")
        eos = c.get("eos_token_id")
        eos = () if eos is None else tuple(eos) if isinstance(eos, list) else (eos,)
        heads = c["num_attention_heads"]
        return cls(
            vocab_size=c["vocab_size"], hidden_size=c["hidden_size"],
            num_layers=c["num_hidden_layers"], num_heads=heads,
            num_kv_heads=c.get("num_key_value_heads") or heads,
            head_dim=c.get("head_dim") or c["hidden_size"] // heads,
            intermediate_size=c["intermediate_size"], rms_norm_eps=c.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope.get("rope_theta", c.get("rope_theta", 10000.0))),
            max_position_embeddings=c.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
            attention_bias=bool(c.get("attention_bias", arch == "Qwen2ForCausalLM")),
            eos_token_ids=eos, bos_token_id=c.get("bos_token_id"),
            quantization=read_quant_config(c, folder),
        )


@dataclass
class AttentionMetadata:
    """The paged-attention inputs of one step (layouts in kernels/attention.py)."""

    slot_mapping: torch.Tensor     # [T] int64
    block_tables: torch.Tensor     # [B, M] int32
    seq_lens: torch.Tensor         # [B] int32
    query_start_loc: torch.Tensor  # [B + 1] int32


@dataclass
class FusedLayerWeights:
    """One decoder layer as the forward pass reads it: its two norm weights and its
    projections, fused where they share an input (q|k|v, gate|up)."""

    input_norm: torch.Tensor
    qkv: Linear        # q|k|v fused along N (engine/quant/linear.py: dense, w8 or w4)
    o: Linear
    post_norm: torch.Tensor
    gate_up: Linear    # gate|up fused along N
    down: Linear


def load_tensors(folder: pathlib.Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelError(f"{folder} has no *.safetensors weights")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(str(f)))
    return tensors


class LlamaModel:
    def __init__(self, folder: str | pathlib.Path, ops: KernelOps, dtype: torch.dtype,
                 device: str | torch.device = "cpu", max_model_len: int | None = None):
        folder = pathlib.Path(folder)
        self.config = cfg = ModelConfig.from_folder(folder)
        self.ops = ops
        self.dtype = dtype
        self.device = torch.device(device)
        self.max_model_len = min(max_model_len or cfg.max_position_embeddings,
                                 cfg.max_position_embeddings)
        self.scale = cfg.head_dim ** -0.5
        t = load_tensors(folder)

        def stored(name: str, required: bool = True) -> torch.Tensor | None:
            for prefix in ("model.", ""):
                if prefix + name in t:
                    return t[prefix + name]
            if required:
                raise ModelError(f"{folder}: weight {name!r} is missing from the safetensors files")
            return None

        def take(name: str, required: bool = True) -> torch.Tensor | None:
            w = stored(name, required)
            return None if w is None else w.to(device=self.device, dtype=dtype).contiguous()

        def linear(*names: str) -> Linear:
            return load_linear(stored, names, cfg.quantization, dtype, self.device, ops.name, folder)

        self.embed = take("embed_tokens.weight")
        self.norm = take("norm.weight")
        lm_head = take("lm_head.weight", required=False)
        self.lm_head = self.embed if lm_head is None or cfg.tie_word_embeddings else lm_head
        self.layers: list[FusedLayerWeights] = []
        for i in range(cfg.num_layers):
            p = f"layers.{i}."
            self.layers.append(FusedLayerWeights(
                input_norm=take(p + "input_layernorm.weight"),
                qkv=linear(*(p + f"self_attn.{n}_proj" for n in "qkv")),
                o=linear(p + "self_attn.o_proj"),
                post_norm=take(p + "post_attention_layernorm.weight"),
                gate_up=linear(p + "mlp.gate_proj", p + "mlp.up_proj"),
                down=linear(p + "mlp.down_proj"),
            ))
        del t
        self.cos_sin = rope_cos_sin(cfg.head_dim, self.max_model_len, cfg.rope_theta, device=self.device)
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim

    def kv_bytes_per_block(self, block_size: int) -> int:
        c = self.config
        return 2 * c.num_layers * block_size * c.num_kv_heads * c.head_dim * self.dtype.itemsize

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        c = self.config
        shape = (num_blocks, block_size, c.num_kv_heads, c.head_dim)
        return [(torch.zeros(shape, dtype=self.dtype, device=self.device),
                 torch.zeros(shape, dtype=self.dtype, device=self.device)) for _ in range(c.num_layers)]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                logits_indices: torch.Tensor) -> torch.Tensor:
        """input_ids/positions [T] -> fp32 logits [len(logits_indices), vocab]."""
        return self.compute_logits(self.forward_hidden(input_ids, positions, meta, kv_caches, logits_indices))

    def compute_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final hidden states [R, hidden] -> fp32 logits [R, vocab]."""
        return F.linear(h, self.lm_head).float()

    def forward_hidden(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                       kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                       rows: torch.Tensor) -> torch.Tensor:
        """input_ids/positions [T] -> final-normed hidden states of `rows` [len(rows), hidden]
        (the LM head is left to the caller: prompt logprobs take it in pieces)."""
        c, ops = self.config, self.ops
        T = input_ids.shape[0]
        h = F.embedding(input_ids, self.embed)
        residual = None
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches):
            x, residual = ops.rms_norm(h, layer.input_norm, c.rms_norm_eps, residual)
            qkv = layer.qkv(x)
            q = qkv[:, :self.q_size].view(T, c.num_heads, c.head_dim)
            k = qkv[:, self.q_size:self.q_size + self.kv_size].view(T, c.num_kv_heads, c.head_dim)
            v = qkv[:, self.q_size + self.kv_size:].view(T, c.num_kv_heads, c.head_dim)
            ops.rotary(q, k, positions, self.cos_sin)
            ops.write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
            o = ops.paged_attention(q, k_cache, v_cache, meta.block_tables, meta.seq_lens,
                                    meta.query_start_loc, self.scale)
            h = layer.o(o.reshape(T, self.q_size))
            x, residual = ops.rms_norm(h, layer.post_norm, c.rms_norm_eps, residual)
            h = layer.down(ops.silu_and_mul(layer.gate_up(x)))
        # only the rows that sample (or score) need the final norm and the LM head
        h, _ = ops.rms_norm(h[rows], self.norm, c.rms_norm_eps, residual[rows])
        return h
