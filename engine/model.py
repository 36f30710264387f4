"""The decoder of every supported family over a flattened, paged batch.

One forward takes every scheduled token of every sequence concatenated (no padding); the
layer math calls only the `KernelOps` it was given, so the Triton kernels slot in. What a
family changes (engine/model_config.py) is data here: per-layer sliding windows and RoPE
tables, q/k norms, Gemma's norms around attention and MLP, the MLP's activation, the
embedding scale, the attention scale and final-logit soft-capping.

One layer (Llama and most families; the residual add is fused into the next norm):

    x = norm(h)  ->  q|k|v  [-> q/k norm per head]  ->  RoPE  ->  write K/V  ->  attention  ->  o
    x = norm(h + o)  ->  down(act(gate) * up)

Gemma 3 normalises each branch's output before it joins the residual stream:

    h += attn_out_norm(o)        h += mlp_out_norm(down(...))    (MLP input: post_norm(h))
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from inflight.engine.cpu_forward import forward_hidden_cpu
from inflight.engine.lora.slots import LoraSlots, LoraStep
from inflight.engine.model_config import SUPPORTED_ARCHS, ModelConfig  # noqa: F401 (re-exported)
from inflight.engine.model_weights import FusedLayerWeights, load_tensors, load_weights  # noqa: F401
from inflight.engine.quant.linear import F32_KERNEL_MAX_ROWS, dense_linear
from inflight.engine.rope import rope_cos_sin_table
from inflight.kernels.activation import gelu_tanh_and_mul_ref
from inflight.kernels.cpu_native import native
from inflight.kernels.cpu_ops import cpu_ops
from inflight.kernels.kv_quant import SCALE_DTYPE, cache_bytes_per_token_head, is_quantized
from inflight.kernels.ops import KernelOps


@dataclass
class AttentionMetadata:
    """The paged-attention inputs of one step (layouts in kernels/attention.py)."""

    slot_mapping: torch.Tensor     # [T] int64
    block_tables: torch.Tensor     # [B, M] int32
    seq_lens: torch.Tensor         # [B] int32
    query_start_loc: torch.Tensor  # [B + 1] int32
    lora: LoraStep | None = None   # the step's adapter slots (engine/lora/slots.py), None: none


class DecoderModel:
    """The decoder of every supported family (engine/model_config.py: Llama, Qwen2/3,
    Mistral, Gemma 3, Phi-3)."""

    def __init__(self, folder: str | pathlib.Path, ops: KernelOps, dtype: torch.dtype,
                 device: str | torch.device = "cpu", max_model_len: int | None = None,
                 kv_dtype: torch.dtype | None = None):
        folder = pathlib.Path(folder)
        cfg, tensors = self.read_checkpoint(folder)
        self.config = cfg
        self.ops = ops
        self.dtype = dtype
        # what the KV cache stores: the model dtype, or int8 / fp8 with scales (kernels/kv_quant.py)
        self.kv_dtype = kv_dtype or dtype
        self.device = torch.device(device)
        self.max_model_len = min(max_model_len or cfg.max_context, cfg.max_context)
        self.scale = cfg.scale
        w = load_weights(cfg, tensors, dtype, self.device, ops.name, folder)
        del tensors
        self.embed, self.norm, self.lm_head, self.layers = w.embed, w.norm, w.lm_head, w.layers
        # (a CPU-only copy: on CUDA lm_head16 is None and the kernels are never built)
        self.lm_head16 = (w.lm_head16 if w.lm_head16 is not None and native() is not None
                          and native().f32_linear_supported() else None)
        self.embed_scale = (None if cfg.embed_scale is None else
                            torch.tensor(cfg.embed_scale, dtype=dtype, device=self.device))
        tables = {spec: rope_cos_sin_table(spec, cfg.head_dim, cfg.max_position_embeddings,
                                           self.max_model_len, device=self.device)
                  for spec in {layer.rope for layer in cfg.layers}}
        self.layer_cos_sin = [tables[layer.rope] for layer in cfg.layers]
        self.cos_sin = self.layer_cos_sin[0]
        # a window as wide as the context hides nothing: such layers run unmasked
        self.windows = [w if w is not None and w < self.max_model_len else None
                        for w in cfg.sliding_windows]
        self.act = ops.silu_and_mul if cfg.activation == "silu" else gelu_tanh_and_mul_ref
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        # the torch kernels on a CPU take the CPU forward (engine/cpu_forward.py): the same
        # math with the step's invariants planned once per forward; CUDA never does
        self.cpu_ops = cpu_ops() if self.device.type == "cpu" and ops.name == "torch" else None
        # the LoRA adapters' slot tensors (engine/lora), set by the engine when it serves adapters
        self.lora: LoraSlots | None = None

    def read_checkpoint(self, folder: pathlib.Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
        """The config the forward runs and the checkpoint's tensors (a tensor-parallel rank:
        its heads and its slices, engine/parallel/sharded_model.py)."""
        return ModelConfig.from_folder(folder), load_tensors(folder)

    def kv_bytes_per_block(self, block_size: int) -> int:
        c = self.config
        return 2 * c.num_layers * block_size * c.num_kv_heads * cache_bytes_per_token_head(self.kv_dtype, c.head_dim)

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> list[tuple[torch.Tensor, ...]]:
        """Per layer (k_cache, v_cache), or (k_cache, v_cache, k_scale, v_scale) for an
        8-bit cache (layouts in kernels/attention.py and kernels/kv_quant.py)."""
        c = self.config
        shape = (num_blocks, block_size, c.num_kv_heads, c.head_dim)

        def layer() -> tuple[torch.Tensor, ...]:
            kv = tuple(torch.zeros(shape, dtype=self.kv_dtype, device=self.device) for _ in range(2))
            if not is_quantized(self.kv_dtype):
                return kv
            return kv + tuple(torch.ones(shape[:3], dtype=SCALE_DTYPE, device=self.device) for _ in range(2))

        return [layer() for _ in range(c.num_layers)]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv_caches: list[tuple[torch.Tensor, ...]],
                logits_indices: torch.Tensor) -> torch.Tensor:
        """input_ids/positions [T] -> fp32 logits [len(logits_indices), vocab]."""
        return self.compute_logits(self.forward_hidden(input_ids, positions, meta, kv_caches, logits_indices))

    def compute_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final hidden states [R, hidden] -> fp32 logits [R, vocab]."""
        if self.lm_head16 is not None and h.shape[0] <= F32_KERNEL_MAX_ROWS:
            logits = native().bf16_linear(h.contiguous(), self.lm_head16, None)  # a decode's rows
        else:
            logits = dense_linear(h, self.lm_head)  # oneDNN for a verification's few rows on CPU
        cap = self.config.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits.float()

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = F.embedding(input_ids, self.embed)
        return h if self.embed_scale is None else h * self.embed_scale

    def forward_hidden(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                       kv_caches: list[tuple[torch.Tensor, ...]],
                       rows: torch.Tensor) -> torch.Tensor:
        """input_ids/positions [T] -> final-normed hidden states of `rows` [len(rows), hidden]
        (the LM head is left to the caller: prompt logprobs take it in pieces)."""
        if self.cpu_ops is not None:
            return forward_hidden_cpu(self, self.cpu_ops, input_ids, positions, meta, kv_caches, rows)
        c, ops = self.config, self.ops
        eps = c.rms_norm_eps
        T = input_ids.shape[0]
        h = self.embed_tokens(input_ids)
        residual = None
        lora = self.lora if meta.lora is not None else None
        for i, (layer, (k_cache, v_cache, *scales)) in enumerate(zip(self.layers, kv_caches)):
            x, residual = ops.rms_norm(h, layer.input_norm, eps, residual)
            qkv = layer.qkv(x)
            if lora is not None:
                lora.apply(qkv, x, i, "qkv", meta.lora)
            q = qkv[:, :self.q_size].view(T, c.num_heads, c.head_dim)
            k = qkv[:, self.q_size:self.q_size + self.kv_size].view(T, c.num_kv_heads, c.head_dim)
            v = qkv[:, self.q_size + self.kv_size:].view(T, c.num_kv_heads, c.head_dim)
            if layer.q_norm is not None:
                q, _ = ops.rms_norm(q, layer.q_norm, eps)
                k, _ = ops.rms_norm(k, layer.k_norm, eps)
            ops.rotary(q, k, positions, self.layer_cos_sin[i])
            ops.write_kv(k, v, k_cache, v_cache, meta.slot_mapping, *scales)
            window = self.windows[i]
            extra = {} if window is None else {"sliding_window": window}
            if scales:
                extra.update(k_scale=scales[0], v_scale=scales[1])
            o = ops.paged_attention(q, k_cache, v_cache, meta.block_tables, meta.seq_lens,
                                    meta.query_start_loc, self.scale, **extra)
            o = o.reshape(T, self.q_size)
            h = layer.o(o)
            if lora is not None:
                lora.apply(h, o, i, "o", meta.lora)
            if layer.attn_out_norm is not None:
                h, _ = ops.rms_norm(h, layer.attn_out_norm, eps)
            x, residual = ops.rms_norm(h, layer.post_norm, eps, residual)
            if lora is None:
                h = layer.down(self.act(layer.gate_up(x)))
            else:
                m = self.act(lora.apply(layer.gate_up(x), x, i, "gate_up", meta.lora))
                h = lora.apply(layer.down(m), m, i, "down", meta.lora)
            if layer.mlp_out_norm is not None:
                h, _ = ops.rms_norm(h, layer.mlp_out_norm, eps)
        # only the rows that sample (or score) need the final norm and the LM head
        h, _ = ops.rms_norm(h[rows], self.norm, eps, residual[rows])
        return h
