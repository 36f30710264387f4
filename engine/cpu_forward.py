"""The decoder's forward on the CPU with the torch kernels: the same math as
`DecoderModel.forward_hidden`'s generic loop, with what depends only on the step worked out
once per forward instead of once per layer.

Per step (`StepPlan`): the cos/sin rows of each RoPE table, the K/V slots that are written
(and whether some rows are padding), and the attention plan of each distinct sliding
window (kernels/cpu_attention.py: host copies, decode block ids, masks). Per layer, only
the layer's own work runs, through `CpuOps` (kernels/cpu_ops.py: one C++ call per part
for decode-only steps where the kernels build, a few torch ops otherwise): norm with the
residual added in place, q and k rotated in the qkv output and K/V written, attention,
silu times up, and the four matmuls. No layer allocates a Python container or reads a
tensor back to the host.

The CUDA path never comes here (`DecoderModel` takes this path only for the torch kernels on
a CPU device), so nothing on CUDA changes with it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inflight.kernels.cpu_attention import AttentionPlan, plan_attention
from inflight.kernels.cpu_ops import (TORCH_CPU_OPS, CpuOps, StepRope, StepSlots, rope_rows, rotary_cpu,
                                     step_slots, write_kv_cpu)

# NOTE: `model` below is the engine/model.py DecoderModel that calls in, and `meta` its
# AttentionMetadata (not imported: model.py imports this module)


@dataclass(frozen=True)
class StepPlan:
    rope: list[StepRope]              # per layer (shared by layers of one RoPE table)
    attention: list[AttentionPlan]    # per layer (shared by equal windows)
    slots: StepSlots


def plan_step(model, positions: torch.Tensor, meta,
              block_size: int) -> StepPlan:
    rope_of: dict[int, StepRope] = {}
    rope = []
    for cos_sin in model.layer_cos_sin:
        key = id(cos_sin)
        if key not in rope_of:
            rope_of[key] = rope_rows(cos_sin, positions)
        rope.append(rope_of[key])
    plans: dict[int | None, AttentionPlan] = {}
    attention = []
    for window in model.windows:
        if window not in plans:
            plans[window] = plan_attention(meta.block_tables, meta.seq_lens, meta.query_start_loc,
                                           block_size, window)
        attention.append(plans[window])
    return StepPlan(rope, attention, step_slots(meta.slot_mapping))


def forward_hidden_cpu(model, ops: CpuOps, input_ids: torch.Tensor, positions: torch.Tensor, meta,
                       kv_caches: list[tuple[torch.Tensor, ...]], rows: torch.Tensor) -> torch.Tensor:
    """`DecoderModel.forward_hidden` (same arguments and result) on the CPU."""
    c = model.config
    eps = c.rms_norm_eps
    T = input_ids.shape[0]
    H, Hkv, D = c.num_heads, c.num_kv_heads, c.head_dim
    q_size, kv_size = model.q_size, model.kv_size
    plan = plan_step(model, positions, meta, kv_caches[0][0].shape[1])
    if not plan.attention[0].all_decode:
        # NOTE: a step with prompt rows keeps the torch ops, the references' op order: the
        # C++ kernels sum in another order, and prompt logprobs (ranks of unlikely tokens
        # among near-ties) are checked against transformers' bit for bit (tests/engine)
        ops = TORCH_CPU_OPS
    act = ops.silu_and_mul if c.activation == "silu" else model.act
    h = model.embed_tokens(input_ids)
    residual = None
    heads = (H, Hkv, D)
    lora, step_lora = (model.lora, meta.lora) if meta.lora is not None else (None, None)
    for i, (layer, (k_cache, v_cache, *scales)) in enumerate(zip(model.layers, kv_caches)):
        x, residual = ops.rms_norm(h, layer.input_norm, eps, residual)
        qkv = layer.qkv(x)
        if lora is not None:  # adapters add onto each projection's output (engine/lora)
            lora.apply(qkv, x, i, "qkv", step_lora)
        rope = plan.rope[i]
        if layer.q_norm is None:  # q and k side by side in qkv: rotated together, in place
            q, _, _ = ops.rope_kv(qkv, heads, rope, plan.slots, k_cache, v_cache, *scales)
        else:  # per-head norms first (Qwen3, Gemma 3)
            q, _ = ops.rms_norm(qkv[:, :q_size].reshape(T, H, D), layer.q_norm, eps)
            k, _ = ops.rms_norm(qkv[:, q_size:q_size + kv_size].reshape(T, Hkv, D), layer.k_norm, eps)
            rotary_cpu(q, rope.cos, rope.sin)
            rotary_cpu(k, rope.cos, rope.sin)
            v = qkv[:, q_size + kv_size:].view(T, Hkv, D)
            write_kv_cpu(k, v, k_cache, v_cache, plan.slots.valid, plan.slots.keep, *scales)
        o = ops.paged_attention(q, k_cache, v_cache, plan.attention[i], model.scale, *scales)
        o = o.reshape(T, q_size)
        h = layer.o(o)
        if lora is not None:
            lora.apply(h, o, i, "o", step_lora)
        if layer.attn_out_norm is not None:
            h, _ = ops.rms_norm(h, layer.attn_out_norm, eps)
        x, residual = ops.rms_norm(h, layer.post_norm, eps, residual)
        if lora is None:
            h = layer.down(act(layer.gate_up(x)))
        else:
            m = act(lora.apply(layer.gate_up(x), x, i, "gate_up", step_lora))
            h = lora.apply(layer.down(m), m, i, "down", step_lora)
        if layer.mlp_out_norm is not None:
            h, _ = ops.rms_norm(h, layer.mlp_out_norm, eps)
    # only the rows that sample (or score) need the final norm and the LM head
    h, _ = ops.rms_norm(h[rows], model.norm, eps, residual[rows])
    return h
