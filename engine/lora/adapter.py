"""A PEFT LoRA folder (adapter_config.json + adapter_model.safetensors) read and checked.

PEFT stores, for each adapted projection of each layer,

    base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight   [r, in]
    base_model.model.model.layers.{i}.self_attn.q_proj.lora_B.weight   [out, r]

and its forward adds `lora_B(lora_A(x)) * scaling` to the projection's output, with
scaling = lora_alpha / r (rsLoRA: lora_alpha / sqrt(r); `rank_pattern` / `alpha_pattern`
override r and alpha per module). The engine runs q/k/v and gate/up fused
(engine/model_weights.py), so each adapted module becomes a `LoraModule` on one of the
four fused projections, with the rows of the fused output it adds to:

    qkv      q_proj [0, q) | k_proj [q, q+kv) | v_proj [q+kv, q+2kv) | qkv_proj (Phi-3): all
    o        o_proj
    gate_up  gate_proj [0, I) | up_proj [I, 2I) | gate_up_proj (Phi-3): all
    down     down_proj

Anything that changes the math and is not implemented here (DoRA, LoRA biases, embedding
or LM-head targets, modules_to_save, ...) refuses the adapter with a `LoraError` naming
the config key, as model configs do: never a silently different adapter.
"""

from __future__ import annotations

import hashlib
import json
import math
import pathlib
import re
from dataclasses import dataclass, field

import torch

from inflight.engine.errors import InflightError
from inflight.engine.model_config import ModelConfig

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PROJECTIONS = ("qkv", "o", "gate_up", "down")
# how many separately adapted modules a fused projection can hold (its slot columns are
# that many times max_lora_rank)
SUBMODULES = {"qkv": 3, "o": 1, "gate_up": 2, "down": 1}
_KEY = re.compile(r"layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.weight)?$")


class LoraError(InflightError, ValueError):
    """An adapter folder cannot be served (missing files, a key that changes the math and is
    not implemented, a rank above max_lora_rank, shapes that do not fit the base model)."""


@dataclass(frozen=True)
class LoraModule:
    """One adapted projection of one layer: out[:, start:stop] += (x @ a.T) @ b.T (b holds
    the scaling)."""

    layer: int
    proj: str        # one of PROJECTIONS
    start: int       # rows of the fused projection's output it adds to
    stop: int
    a: torch.Tensor  # [r, in]
    b: torch.Tensor  # [stop - start, r], scaled

    @property
    def rank(self) -> int:
        return self.a.shape[0]


@dataclass
class LoraAdapter:
    name: str
    path: pathlib.Path
    rank: int                                  # the largest module rank
    digest: str                                # of the config and weights: keys the prefix cache
    modules: list[LoraModule] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(m.a.numel() * m.a.element_size() + m.b.numel() * m.b.element_size()
                   for m in self.modules)

    @property
    def target_modules(self) -> list[str]:
        return sorted({f"{m.proj}[{m.start}:{m.stop}]" for m in self.modules})


def _module_rows(cfg: ModelConfig) -> dict[str, tuple[str, int, int]]:
    """PEFT module name -> (fused projection, first row, end row) for this base model."""
    q, kv, inter = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size
    if cfg.fused_checkpoint:
        return {"qkv_proj": ("qkv", 0, q + 2 * kv), "o_proj": ("o", 0, cfg.hidden_size),
                "gate_up_proj": ("gate_up", 0, 2 * inter), "down_proj": ("down", 0, cfg.hidden_size)}
    return {"q_proj": ("qkv", 0, q), "k_proj": ("qkv", q, q + kv), "v_proj": ("qkv", q + kv, q + 2 * kv),
            "o_proj": ("o", 0, cfg.hidden_size), "gate_proj": ("gate_up", 0, inter),
            "up_proj": ("gate_up", inter, 2 * inter), "down_proj": ("down", 0, cfg.hidden_size)}


def projection_blocks(cfg: ModelConfig) -> dict[str, list[tuple[int, int]]]:
    """Each fused projection's blocks: the (first, end) rows of its output that one PEFT
    module adapts (q | k | v; gate | up; a fused checkpoint's one module: all rows)."""
    blocks: dict[str, list[tuple[int, int]]] = {p: [] for p in PROJECTIONS}
    for proj, start, stop in _module_rows(cfg).values():
        blocks[proj].append((start, stop))
    return {p: sorted(b) for p, b in blocks.items()}


def projection_in_features(cfg: ModelConfig, proj: str) -> int:
    return {"qkv": cfg.hidden_size, "o": cfg.num_heads * cfg.head_dim,
            "gate_up": cfg.hidden_size, "down": cfg.intermediate_size}[proj]


def projection_out_features(cfg: ModelConfig, proj: str) -> int:
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    return {"qkv": q + 2 * kv, "o": cfg.hidden_size, "gate_up": 2 * cfg.intermediate_size,
            "down": cfg.hidden_size}[proj]


def _refuse_unsupported(config: dict, where: str) -> None:
    """LoraError naming the first config key that changes the math and is not implemented."""
    def refuse(key: str, why: str) -> None:
        raise LoraError(f"{where}: {CONFIG_FILE} has {key}={config.get(key)!r}: {why}; "
                        "this adapter cannot be served")

    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        refuse("peft_type", "only LoRA adapters are supported")
    if config.get("use_dora"):
        refuse("use_dora", "DoRA (weight-decomposed LoRA) is not implemented")
    if config.get("bias", "none") != "none":
        refuse("bias", "trained biases are not implemented (only bias='none')")
    if config.get("lora_bias"):
        refuse("lora_bias", "a bias on lora_B is not implemented")
    if config.get("modules_to_save"):
        refuse("modules_to_save", "fully trained copies of base modules are not implemented")
    if config.get("fan_in_fan_out"):
        refuse("fan_in_fan_out", "Conv1D-style (transposed) weights are not implemented")
    for key in ("trainable_token_indices", "target_parameters", "alora_invocation_tokens",
                "layer_replication"):
        if config.get(key):
            refuse(key, "not implemented")
    if config.get("use_qalora"):
        refuse("use_qalora", "QA-LoRA pooling is not implemented")
    for key in ("target_modules",):
        targets = config.get(key) or []
        targets = [targets] if isinstance(targets, str) else list(targets)
        for t in targets:
            if any(bad in t for bad in ("embed_tokens", "lm_head", "wte")):
                refuse(key, f"target {t!r}: embedding and LM-head adapters are not implemented")


def _pattern_value(patterns: dict, module: str, default):
    """PEFT's rank_pattern / alpha_pattern lookup: a key matches the module name's end."""
    for key, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


def read_adapter_config(path: pathlib.Path) -> dict:
    f = path / CONFIG_FILE
    if not f.is_file():
        raise LoraError(f"{path}: no {CONFIG_FILE} (a PEFT LoRA folder holds {CONFIG_FILE} and "
                        f"{WEIGHTS_FILE}); check the adapter's path")
    try:
        return json.loads(f.read_text())
    except ValueError as exc:
        raise LoraError(f"{f}: not valid JSON ({exc})") from exc


def load_adapter(name: str, path: str | pathlib.Path, cfg: ModelConfig, max_rank: int,
                 dtype: torch.dtype = torch.float32) -> LoraAdapter:
    """Read and check the PEFT folder `path` against the base model `cfg` (on the host)."""
    from safetensors.torch import load_file

    path = pathlib.Path(path)
    config = read_adapter_config(path)
    where = f"adapter {name!r} ({path})"
    _refuse_unsupported(config, where)
    weights = path / WEIGHTS_FILE
    if not weights.is_file():
        raise LoraError(f"{where}: no {WEIGHTS_FILE} (adapter_model.bin pickles are not read: "
                        "save the adapter with safe_serialization=True)")
    raw = weights.read_bytes()
    digest = hashlib.blake2b(raw + json.dumps(config, sort_keys=True).encode(), digest_size=16).hexdigest()
    tensors = load_file(str(weights))
    rows_of = _module_rows(cfg)
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        m = _KEY.search(key)
        if m is None:
            what = "embedding / LM-head" if ("embed" in key or "lm_head" in key) else "unsupported"
            raise LoraError(f"{where}: tensor {key!r} adapts an {what} module (target_modules); "
                            f"only {sorted(rows_of)} of the layers are supported")
        layer, module, ab = int(m.group(1)), m.group(3), m.group(4)
        if module not in rows_of:
            raise LoraError(f"{where}: tensor {key!r} targets {module!r}, which this "
                            f"{cfg.family} base model does not have as a projection "
                            f"(target_modules: use {sorted(rows_of)})")
        if not 0 <= layer < cfg.num_layers:
            raise LoraError(f"{where}: tensor {key!r} names layer {layer}; the base model has "
                            f"{cfg.num_layers} layers (is it an adapter of another model?)")
        pairs.setdefault((layer, module), {})[ab] = t
    if not pairs:
        raise LoraError(f"{where}: {WEIGHTS_FILE} holds no lora_A / lora_B tensors")
    r_default, alpha_default = config.get("r", 8), config.get("lora_alpha", 8)
    rslora = bool(config.get("use_rslora", False))
    modules: list[LoraModule] = []
    for (layer, module), ab in sorted(pairs.items()):
        full = f"model.layers.{layer}.{'self_attn' if module in ('q_proj', 'k_proj', 'v_proj', 'o_proj', 'qkv_proj') else 'mlp'}.{module}"
        if set(ab) != {"A", "B"}:
            raise LoraError(f"{where}: {full} has lora_{''.join(ab)} but not both lora_A and lora_B")
        a, b = ab["A"], ab["B"]
        proj, start, stop = rows_of[module]
        r = a.shape[0]
        if a.dim() != 2 or b.dim() != 2 or b.shape[1] != r:
            raise LoraError(f"{where}: {full}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} "
                            "are not [r, in] and [out, r]")
        if a.shape[1] != projection_in_features(cfg, proj) or b.shape[0] != stop - start:
            raise LoraError(f"{where}: {full}: lora_A {tuple(a.shape)} / lora_B {tuple(b.shape)} do "
                            f"not fit the base model's {module} ({projection_in_features(cfg, proj)} "
                            f"-> {stop - start}): an adapter of another model?")
        if r > max_rank:
            raise LoraError(f"{where}: {full} has rank {r} > max_lora_rank={max_rank}: raise "
                            "EngineConfig.max_lora_rank (inflight worker --max-lora-rank)")
        expected_r = _pattern_value(config.get("rank_pattern"), full, r_default)
        alpha = _pattern_value(config.get("alpha_pattern"), full, alpha_default)
        if expected_r != r:
            raise LoraError(f"{where}: {full} has rank {r} but r / rank_pattern say {expected_r}")
        scaling = alpha / (math.sqrt(r) if rslora else r)
        modules.append(LoraModule(layer, proj, start, stop, a.to(dtype).contiguous(),
                                  (b.float() * scaling).to(dtype).contiguous()))
    return LoraAdapter(name, path, max(m.rank for m in modules), digest, modules)
