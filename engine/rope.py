"""RoPE variants: the inverse frequencies and the cos/sin scale of each `rope_type`, computed
as transformers' `ROPE_INIT_FUNCTIONS` compute them (tests/engine/test_rope.py compares
them bit for bit), so a scaled-RoPE checkpoint rotates exactly as it does there.

    default  1 / theta^(2i/D)
    linear   default / factor                                  (position interpolation)
    dynamic  NTK: theta * ((factor * L / max_pos) - (factor - 1))^(D / (D - 2)) with
             L = max_position_embeddings (contexts never exceed it here, where
             transformers' per-length update leaves the frequencies at this value)
    yarn     a ramp between interpolated and extrapolated frequencies; cos and sin are
             multiplied by an attention factor (0.1 ln(factor) + 1 by default)
    llama3   low frequencies / factor, high ones kept, a smooth blend between

`longrope` (Phi-3 long-context) and any other type are refused by model_config.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3")


@dataclass(frozen=True)
class RopeSpec:
    """One layer type's RoPE: its type and the parameters that type reads."""

    rope_type: str = "default"
    theta: float = 10000.0
    factor: float | None = None
    original_max_position_embeddings: int | None = None
    low_freq_factor: float | None = None        # llama3
    high_freq_factor: float | None = None       # llama3
    attention_factor: float | None = None       # yarn
    beta_fast: float | None = None              # yarn
    beta_slow: float | None = None              # yarn
    mscale: float | None = None                 # yarn
    mscale_all_dim: float | None = None         # yarn
    truncate: bool = True                       # yarn


def _default(theta: float, dim: int) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))


def inv_freq_and_scale(spec: RopeSpec, head_dim: int, max_position_embeddings: int) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [head_dim / 2] fp32, factor on cos and sin)."""
    dim, base = head_dim, spec.theta
    kind = spec.rope_type
    if kind == "default":
        return _default(base, dim), 1.0
    if kind == "linear":
        inv_freq = _default(base, dim)
        inv_freq /= spec.factor
        return inv_freq, 1.0
    if kind == "dynamic":
        seq_len = max_position_embeddings
        base = base * ((spec.factor * seq_len / max_position_embeddings) - (spec.factor - 1)) ** (dim / (dim - 2))
        return _default(base, dim), 1.0
    if kind == "llama3":
        return _llama3(spec, dim), 1.0
    if kind == "yarn":
        return _yarn(spec, dim, max_position_embeddings)
    raise ValueError(f"rope type {kind!r} has no implementation (one of {ROPE_TYPES})")


def _llama3(spec: RopeSpec, dim: int) -> torch.Tensor:
    inv_freq = _default(spec.theta, dim)
    factor = spec.factor
    low, high = spec.low_freq_factor, spec.high_freq_factor
    old_context_len = spec.original_max_position_embeddings
    low_freq_wavelen = old_context_len / low
    high_freq_wavelen = old_context_len / high
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, inv_freq_llama)


def _yarn_mscale(scale: float, mscale: float = 1) -> float:
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def _yarn(spec: RopeSpec, dim: int, max_position_embeddings: int) -> tuple[torch.Tensor, float]:
    base = spec.theta
    original = spec.original_max_position_embeddings
    factor = spec.factor if spec.factor is not None else max_position_embeddings / original
    attention_factor = spec.attention_factor
    if attention_factor is None:
        if spec.mscale and spec.mscale_all_dim:
            attention_factor = float(_yarn_mscale(factor, spec.mscale) / _yarn_mscale(factor, spec.mscale_all_dim))
        else:
            attention_factor = _yarn_mscale(factor)
    beta_fast = spec.beta_fast or 32
    beta_slow = spec.beta_slow or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if spec.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers: no singular ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)

    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (factor * pos_freqs)
    extrapolation_factor = 1 - ramp
    inv_freq = interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor
    return inv_freq, attention_factor


def rope_cos_sin_table(spec: RopeSpec, head_dim: int, max_position_embeddings: int, max_pos: int,
                       device=None) -> torch.Tensor:
    """The [max_pos, head_dim] cos | sin table (kernels/rotary.py layout) of `spec`, fp32,
    with the type's attention factor applied to both halves."""
    from inflight.kernels.rotary import rope_cos_sin

    inv_freq, scale = inv_freq_and_scale(spec, head_dim, max_position_embeddings)
    table = rope_cos_sin(head_dim, max_pos, spec.theta, device=device, inv_freq=inv_freq)
    if scale != 1.0:
        table = table * scale
    return table
