"""Read a checkpoint's tensors into the layout the forward pass reads, per family.

Every family is stored with Hugging Face's names under `model.` (or without the prefix):

    embed_tokens, norm, lm_head (absent or ignored when tied)
    layers.i.input_layernorm, layers.i.post_attention_layernorm
    layers.i.self_attn.{q,k,v,o}_proj     Phi-3: self_attn.qkv_proj (q|k|v) + o_proj
    layers.i.mlp.{gate,up,down}_proj      Phi-3: mlp.gate_up_proj (gate|up) + down_proj
    layers.i.self_attn.{q,k}_norm         Qwen3, Gemma 3
    layers.i.{pre,post}_feedforward_layernorm                                Gemma 3

q/k/v and gate/up are fused at load (Phi-3 stores them fused already). Biases are read
only where the config declares them (Qwen2's q/k/v; `attention_bias` / `mlp_bias`), and
a declared bias must be there. Gemma's RMSNorm weights are stored as w for a (1 + w)
scale: the 1 is added here, so the forward runs one RMSNorm.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass

import torch

from inflight.engine.errors import ModelError
from inflight.engine.model_config import ModelConfig
from inflight.engine.quant.linear import Linear, load_linear


@dataclass
class FusedLayerWeights:
    """One decoder layer as the forward pass reads it."""

    input_norm: torch.Tensor
    qkv: Linear        # q|k|v fused along N (engine/quant/linear.py: dense, w8 or w4)
    o: Linear
    post_norm: torch.Tensor   # the norm before the MLP (Gemma: pre_feedforward_layernorm)
    gate_up: Linear    # gate|up fused along N
    down: Linear
    q_norm: torch.Tensor | None = None         # per head (Qwen3, Gemma 3)
    k_norm: torch.Tensor | None = None
    attn_out_norm: torch.Tensor | None = None  # Gemma 3: post_attention_layernorm
    mlp_out_norm: torch.Tensor | None = None   # Gemma 3: post_feedforward_layernorm


@dataclass
class ModelWeights:
    embed: torch.Tensor
    norm: torch.Tensor
    lm_head: torch.Tensor
    layers: list[FusedLayerWeights]
    # the LM head as stored in bf16, when an fp32 model on the CPU holds it upcast (a
    # quantized folder's head): its values are bf16's, so reading these 2 bytes a weight
    # and widening them in registers computes the same logits (engine/model.py)
    lm_head16: torch.Tensor | None = None


def load_tensors(folder: pathlib.Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(pathlib.Path(folder).glob("*.safetensors"))
    if not files:
        raise ModelError(f"{folder} has no *.safetensors weights")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(str(f)))
    return tensors


def load_weights(cfg: ModelConfig, t: dict[str, torch.Tensor], dtype: torch.dtype,
                 device: torch.device, backend: str, folder: object) -> ModelWeights:
    if cfg.fused_checkpoint and cfg.quantization is not None:
        raise ModelError(f"{folder}: a quantized {cfg.family} folder is not supported (its fused "
                         "qkv_proj / gate_up_proj are not among the quantized projections)")
    bias_of = _declared_biases(cfg)

    def stored(name: str, required: bool = True) -> torch.Tensor | None:
        if name.endswith(".bias"):
            declared = any(name.endswith(f"{proj}.bias") for proj in bias_of)
            if not declared:
                return None  # transformers would not read it either
            required = True
        for prefix in ("model.", ""):
            if prefix + name in t:
                return t[prefix + name]
        if required:
            raise ModelError(f"{folder}: weight {name!r} is missing from the safetensors files")
        return None

    def take(name: str, required: bool = True) -> torch.Tensor | None:
        w = stored(name, required)
        return None if w is None else w.to(device=device, dtype=dtype).contiguous()

    def norm(name: str) -> torch.Tensor:
        w = stored(name)
        if cfg.gemma_norms:  # (1 + w), added in fp32 as transformers does
            w = w.float() + 1.0
        return w.to(device=device, dtype=dtype).contiguous()

    def linear(*names: str) -> Linear:
        layer = load_linear(stored, names, cfg.quantization, dtype, device, backend, folder)
        # drop the checkpoint's tensors once the layer holds what it reads (a converted or
        # fused copy): loading never holds both for the whole model
        for n in names:
            for key in [k for k in t if k.startswith((n + ".", "model." + n + "."))]:
                del t[key]
        return layer

    layers = []
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        attn, mlp = p + "self_attn.", p + "mlp."
        if cfg.fused_checkpoint:
            qkv, gate_up = linear(attn + "qkv_proj"), linear(mlp + "gate_up_proj")
        else:
            qkv = linear(*(attn + f"{n}_proj" for n in "qkv"))
            gate_up = linear(mlp + "gate_proj", mlp + "up_proj")
        layer = FusedLayerWeights(
            input_norm=norm(p + "input_layernorm.weight"), qkv=qkv, o=linear(attn + "o_proj"),
            post_norm=norm(p + ("pre_feedforward_layernorm" if cfg.gemma_norms
                                else "post_attention_layernorm") + ".weight"),
            gate_up=gate_up, down=linear(mlp + "down_proj"))
        if cfg.qk_norm:
            layer.q_norm, layer.k_norm = norm(attn + "q_norm.weight"), norm(attn + "k_norm.weight")
        if cfg.gemma_norms:
            layer.attn_out_norm = norm(p + "post_attention_layernorm.weight")
            layer.mlp_out_norm = norm(p + "post_feedforward_layernorm.weight")
        layers.append(layer)
    embed = take("embed_tokens.weight")
    lm_head = None if cfg.tie_word_embeddings else take("lm_head.weight", required=False)
    head_name = "embed_tokens.weight" if lm_head is None else "lm_head.weight"
    raw_head = stored(head_name)
    head16 = (raw_head.contiguous() if device.type == "cpu" and dtype == torch.float32
              and raw_head.dtype == torch.bfloat16 else None)
    return ModelWeights(embed=embed, norm=norm("norm.weight"),
                        lm_head=embed if lm_head is None else lm_head, layers=layers, lm_head16=head16)


def _declared_biases(cfg: ModelConfig) -> tuple[str, ...]:
    """The projections whose biases the family's transformers model has."""
    out: tuple[str, ...] = ()
    if cfg.attention_bias:
        out += ("q_proj", "k_proj", "v_proj")
    if cfg.o_bias:
        out += ("o_proj",)
    if cfg.mlp_bias:
        out += ("gate_proj", "up_proj", "down_proj")
    return out
