"""GPTQ over a whole model, one decoder layer at a time, on calibration token windows.

A plain, unpaged fp32 forward (same math as engine/model.py: RMSNorm, RoPE, GQA causal
attention, SwiGLU) carries the calibration activations X [n, L, hidden] through the
layers. Inside a layer every projection is quantized in order and its *quantized* output
feeds the next one ("true sequential"), so each GPTQ problem sees the errors of
everything before it:

    x = norm(X)            -> H(x)   -> q, k, v quantized
    a = attention(q, k, v) -> H(a)   -> o quantized           X += o(a)
    x = norm(X)            -> H(x)   -> gate, up quantized
    m = silu(gate) * up    -> H(m)   -> down quantized        X += down(m)
"""

from __future__ import annotations

import time
from typing import Callable

import torch
import torch.nn.functional as F

from inflight.engine.model import ModelConfig
from inflight.engine.quant.config import QuantConfig
from inflight.engine.quant.gptq import HessianAccumulator, gptq_quantize
from inflight.engine.quant.rtn import QuantizedWeight
from inflight.kernels.rmsnorm import rms_norm_ref
from inflight.kernels.rotary import rope_cos_sin

CHUNK = 8  # calibration windows per forward piece (bounds the [chunk, L, intermediate] peak)


class Fp32LayerView:
    """fp32 views of one decoder layer's stored tensors, by short name ("self_attn.q_proj"),
    with the projections already quantized replaced by their dequantized weights."""

    def __init__(self, get: Callable[[str], torch.Tensor | None], prefix: str):
        self.get, self.prefix = get, prefix
        self.replaced: dict[str, torch.Tensor] = {}

    def weight(self, name: str) -> torch.Tensor:
        return self.replaced.get(name, self.get(f"{self.prefix}{name}.weight").float())

    def bias(self, name: str) -> torch.Tensor | None:
        b = self.get(f"{self.prefix}{name}.bias")
        return None if b is None else b.float()

    def linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.linear(x, self.weight(name), self.bias(name))

    def norm(self, name: str) -> torch.Tensor:
        return self.get(f"{self.prefix}{name}.weight").float()


def attention(w: Fp32LayerView, x: torch.Tensor, cfg: ModelConfig, cos_sin: torch.Tensor) -> torch.Tensor:
    """Causal GQA attention of a [n, L, hidden] chunk -> [n, L, heads * head_dim] (pre-o_proj)."""
    n, length, _ = x.shape
    d = cfg.head_dim
    q = w.linear(x, "self_attn.q_proj").view(n * length, cfg.num_heads, d)
    k = w.linear(x, "self_attn.k_proj").view(n * length, cfg.num_kv_heads, d)
    v = w.linear(x, "self_attn.v_proj").view(n, length, cfg.num_kv_heads, d)
    half = d // 2
    cs = cos_sin[:length].repeat(n, 1)
    cos, sin = cs[:, None, :half], cs[:, None, half:]

    def rope(t: torch.Tensor) -> torch.Tensor:
        t1, t2 = t[..., :half], t[..., half:]
        return torch.cat([t1 * cos - t2 * sin, t2 * cos + t1 * sin], dim=-1)

    q = rope(q).view(n, length, cfg.num_heads, d).transpose(1, 2)
    k = rope(k).view(n, length, cfg.num_kv_heads, d).transpose(1, 2)
    v = v.transpose(1, 2)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, scale=d ** -0.5)
    return o.transpose(1, 2).reshape(n, length, cfg.num_heads * d)


def _chunks(x: torch.Tensor):
    for i in range(0, x.shape[0], CHUNK):
        yield x[i:i + CHUNK]


def _hessian(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, k: int) -> HessianAccumulator:
    acc = HessianAccumulator(k)
    for part in _chunks(x):
        acc.add(fn(part))
    return acc


def gptq_model(get: Callable[[str], torch.Tensor | None], cfg: ModelConfig, quant: QuantConfig,
               windows: torch.Tensor, log: Callable[[str], None] = print) -> dict[str, QuantizedWeight]:
    """Quantize every decoder projection with GPTQ. `get(full_name)` returns a stored tensor
    or None; `windows` [n, L] int64 token ids. Returns {"model.layers.i.<proj>": weight}."""
    cos_sin = rope_cos_sin(cfg.head_dim, windows.shape[1], cfg.rope_theta)
    x = F.embedding(windows, get("model.embed_tokens.weight").float())
    eps = cfg.rms_norm_eps
    out: dict[str, QuantizedWeight] = {}
    for i in range(cfg.num_layers):
        t0 = time.monotonic()
        w = Fp32LayerView(get, f"model.layers.{i}.")

        def quantize(names: tuple[str, ...], acc: HessianAccumulator) -> None:
            h = acc.hessian()
            for name in names:
                qw, deq = gptq_quantize(w.weight(name), h, quant)
                out[f"model.layers.{i}.{name}"] = qw
                w.replaced[name] = deq

        def normed(part: torch.Tensor, norm: str) -> torch.Tensor:
            return rms_norm_ref(part, w.norm(norm), eps)[0]

        quantize(("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                 _hessian(lambda p: normed(p, "input_layernorm"), x, cfg.hidden_size))
        attn = torch.cat([attention(w, normed(p, "input_layernorm"), cfg, cos_sin) for p in _chunks(x)])
        quantize(("self_attn.o_proj",), _hessian(lambda p: p, attn, attn.shape[-1]))
        x = x + w.linear(attn, "self_attn.o_proj")
        del attn
        quantize(("mlp.gate_proj", "mlp.up_proj"),
                 _hessian(lambda p: normed(p, "post_attention_layernorm"), x, cfg.hidden_size))

        def act(p: torch.Tensor) -> torch.Tensor:
            m = normed(p, "post_attention_layernorm")
            return F.silu(w.linear(m, "mlp.gate_proj")) * w.linear(m, "mlp.up_proj")

        mid = torch.cat([act(p) for p in _chunks(x)])
        quantize(("mlp.down_proj",), _hessian(lambda p: p, mid, cfg.intermediate_size))
        x = x + w.linear(mid, "mlp.down_proj")
        del mid
        log(f"layer {i + 1}/{cfg.num_layers}: gptq {quant.scheme}"
            f"{'' if quant.group_size is None else f' g{quant.group_size}'} "
            f"on {windows.numel()} tokens, {time.monotonic() - t0:.1f}s")
    return out
