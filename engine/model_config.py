"""Read a Hugging Face config.json into the frozen `ModelConfig` the model is built from.

Families (architectures) and what each changes from a Llama-2 decoder:

    llama    LlamaForCausalLM     RoPE scaling (llama3, linear, dynamic, yarn); biases if declared
    mistral  MistralForCausalLM   `sliding_window` on every layer (when set)
    qwen2    Qwen2ForCausalLM     q/k/v biases; `use_sliding_window` from layer `max_window_layers`
    qwen3    Qwen3ForCausalLM     RMSNorm of q and k per head; explicit `head_dim`
    gemma3   Gemma3ForCausalLM    sliding/full `layer_types`, each with its own RoPE; (1 + w)
                                  RMSNorm; GELU-tanh; embeddings * sqrt(hidden); q/k norm;
                                  scale query_pre_attn_scalar^-0.5; norms around the MLP too
    phi3     Phi3ForCausalLM      fused qkv_proj / gate_up_proj weights; `sliding_window`

A key the file leaves out takes the default of the family's transformers config class
(DEFAULTS), as transformers would. Both RoPE spellings are read: 4.x `rope_scaling` (+
`rope_theta`) and 5.x `rope_parameters`, flat or keyed by layer type.

NOTE: never silently wrong. A key that changes the math and is not implemented here
(REFUSED, unknown RoPE types, `longrope`, other layer types) raises a `ModelError` that
names the key and its value; tests/engine/test_model_config.py walks the families' config
classes so that a key transformers adds is classified here before it can be ignored.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass

from inflight.engine.errors import ModelError
from inflight.engine.quant.config import QuantConfig, read_quant_config
from inflight.engine.rope import ROPE_TYPES, RopeSpec

ARCHITECTURES = {
    "LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3", "Gemma3ForCausalLM": "gemma3", "Phi3ForCausalLM": "phi3",
}
SUPPORTED_ARCHS = tuple(ARCHITECTURES)
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
LAYER_TYPES = ("full_attention", "sliding_attention")

# The class defaults of transformers' config classes that matter when config.json omits them.
_COMMON = dict(rms_norm_eps=1e-6, tie_word_embeddings=False, hidden_act="silu", rope_theta=10000.0,
               attention_bias=False, mlp_bias=False, bos_token_id=1, eos_token_id=2)
_QWEN = dict(max_position_embeddings=32768, use_sliding_window=False, sliding_window=4096,
             max_window_layers=28, num_key_value_heads=32, bos_token_id=None, eos_token_id=None)
DEFAULTS: dict[str, dict] = {
    "llama": _COMMON | dict(max_position_embeddings=2048),
    "mistral": _COMMON | dict(max_position_embeddings=4096 * 32, sliding_window=4096,
                              num_key_value_heads=8),
    "qwen2": _COMMON | _QWEN | dict(attention_bias=True),
    "qwen3": _COMMON | _QWEN | dict(head_dim=128),
    "gemma3": _COMMON | dict(max_position_embeddings=131072, sliding_window=4096, head_dim=256,
                             num_key_value_heads=4, tie_word_embeddings=True, query_pre_attn_scalar=256,
                             hidden_activation="gelu_pytorch_tanh", rope_theta=1_000_000.0,
                             rope_local_base_freq=10_000.0, sliding_window_pattern=6,
                             bos_token_id=2, eos_token_id=1),
    "phi3": _COMMON | dict(max_position_embeddings=4096, rms_norm_eps=1e-5, sliding_window=None,
                           eos_token_id=32000),
}
# keys whose explicit null means something (no window, "as many as the query heads", ...)
# rather than "the class default"
_NULL_MEANS = ("sliding_window", "num_key_value_heads", "head_dim", "bos_token_id", "eos_token_id")

# Keys whose values change the math in some transformers family and that this engine does
# not implement: key -> the values that leave the math as implemented (None = key absent).
REFUSED: dict[str, tuple] = {
    "partial_rotary_factor": (None, 1, 1.0),      # RoPE on part of the head (Phi-4-mini, ...)
    "rotary_pct": (None, 1, 1.0),
    "attn_logit_softcapping": (None,),            # Gemma 2
    "use_bidirectional_attention": (None, False),
    "alibi": (None, False), "use_alibi": (None, False),
    "position_embedding_type": (None, "rope", "rotary"),
    "num_experts": (None, 0, 1), "num_local_experts": (None, 0, 1), "n_routed_experts": (None, 0),
    "moe_intermediate_size": (None, 0), "num_experts_per_tok": (None, 0, 1),
    "attention_chunk_size": (None,),              # Llama 4 chunked attention
    "no_rope_layers": (None,), "no_rope_layer_interval": (None, 0),
    "use_qk_norm": (None, False), "qk_layernorm": (None, False), "clip_qkv": (None,),
    "embedding_multiplier": (None, 1, 1.0), "residual_multiplier": (None, 1, 1.0),
    "attention_multiplier": (None,), "logits_scaling": (None, 1, 1.0), "logit_scale": (None, 1, 1.0),
    "parallel_attn": (None, False), "use_parallel_residual": (None, False),
    "sliding_window_layers": (None,), "global_attn_every_n_layers": (None,),
}
FAMILY_ONLY_REFUSED = {  # refused in every family but the ones that implement them
    "final_logit_softcapping": ("gemma3",),
}
# What the reader reads (READ) and what cannot change a greedy forward (INERT): with
# REFUSED they cover every field of the families' transformers config classes (tested).
READ = frozenset((
    "architectures", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act", "hidden_activation",
    "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings", "rope_parameters",
    "rope_scaling", "rope_theta", "rope_local_base_freq", "original_max_position_embeddings",
    "attention_bias", "mlp_bias", "sliding_window", "use_sliding_window", "max_window_layers",
    "layer_types", "sliding_window_pattern", "_sliding_window_pattern", "query_pre_attn_scalar",
    "final_logit_softcapping", "bos_token_id", "eos_token_id", "quantization", "quantization_config",
))
INERT = frozenset((
    "_name_or_path", "chunk_size_feed_forward", "dtype", "torch_dtype", "id2label", "label2id",
    "is_encoder_decoder", "model_type", "output_attentions", "output_hidden_states",
    "problem_type", "return_dict", "transformers_version", "initializer_range", "use_cache",
    "pad_token_id", "attention_dropout", "resid_pdrop", "embd_pdrop",
    "pretraining_tp",  # transformers 5 no longer reads it: the weights are whole
))


@dataclass(frozen=True)
class LayerSpec:
    """What differs between the decoder layers of one model."""

    sliding_window: int | None  # the layer sees its last `sliding_window` keys (None: all)
    rope: RopeSpec


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
    rope_theta: float            # the first layer's (full-attention models: every layer's)
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool         # q/k/v (+ o where the family puts one there) carry biases
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    quantization: QuantConfig | None = None
    family: str = "llama"
    layers: tuple[LayerSpec, ...] = ()
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False                 # RMSNorm of q and k per head (Qwen3, Gemma 3)
    gemma_norms: bool = False             # (1 + w) RMSNorm, norms around attention and MLP
    activation: str = "silu"              # of the gated MLP
    embed_scale: float | None = None      # embeddings * this (Gemma: sqrt(hidden))
    attn_scale: float | None = None       # None: head_dim^-0.5
    final_logit_softcapping: float | None = None
    fused_checkpoint: bool = False        # qkv_proj / gate_up_proj stored fused (Phi-3)

    @property
    def scale(self) -> float:
        return self.attn_scale if self.attn_scale is not None else self.head_dim ** -0.5

    @property
    def max_context(self) -> int:
        """The longest context the checkpoint runs: max_position_embeddings, or a YaRN
        layer's original length x factor when longer (Qwen2.5 enables 128k by adding
        rope_scaling to a 32k config; YaRN's frequencies do not depend on the length)."""
        longest = self.max_position_embeddings
        for layer in self.layers:
            r = layer.rope
            if r.rope_type == "yarn" and r.factor and r.original_max_position_embeddings:
                longest = max(longest, int(r.original_max_position_embeddings * r.factor))
        return longest

    @property
    def sliding_windows(self) -> tuple[int | None, ...]:
        return tuple(layer.sliding_window for layer in self.layers)

    def is_llama2_math(self, context: int) -> bool:
        """Whether a forward over `context` tokens is Llama-2's (plain RoPE, no window
        inside the context, SwiGLU, plain norms): what GPTQ's calibration pass computes."""
        return (not (self.qk_norm or self.gemma_norms or self.fused_checkpoint)
                and self.activation == "silu" and self.embed_scale is None
                and all(l.rope.rope_type == "default" and l.rope.theta == self.rope_theta
                        and (l.sliding_window is None or l.sliding_window >= context)
                        for l in self.layers))

    @classmethod
    def from_folder(cls, folder: pathlib.Path) -> "ModelConfig":
        path = pathlib.Path(folder) / "config.json"
        if not path.is_file():
            raise ModelError(f"{folder} has no config.json: point EngineConfig.model at a "
                             "Hugging Face model folder (config.json, *.safetensors, tokenizer.json)")
        return cls.from_dict(json.loads(path.read_text()), folder)

    @classmethod
    def from_dict(cls, raw: dict, where: object = "config.json") -> "ModelConfig":
        arch = (raw.get("architectures") or ["?"])[0]
        family = ARCHITECTURES.get(arch)
        if family is None:
            hint = (" (a Gemma 3 multimodal checkpoint: serve its text model as Gemma3ForCausalLM)"
                    if arch == "Gemma3ForConditionalGeneration" else "")
            raise ModelError(f"{where}: architecture {arch!r} is not supported{hint}; the engine "
                             f"runs {', '.join(SUPPORTED_ARCHS)}")
        return _read(raw, family, where, cls)


def _refuse(where: object, key: str, value, why: str) -> ModelError:
    return ModelError(f"{where}: config key {key!r} = {value!r} is not supported ({why}); "
                      "the engine refuses a model it would run wrongly")


def _required(c: dict, key: str, where: object):
    if c.get(key) is None:
        raise ModelError(f"{where}: config.json has no {key!r}")
    return c[key]


def _check_refused(c: dict, family: str, where: object) -> None:
    for key, fine in REFUSED.items():
        if c.get(key) not in fine:
            raise _refuse(where, key, c[key], "this math is not implemented")
    for key, families in FAMILY_ONLY_REFUSED.items():
        if family not in families and c.get(key) is not None:
            raise _refuse(where, key, c[key], f"implemented for {', '.join(families)} only")
    act_key = "hidden_activation" if family == "gemma3" else "hidden_act"
    if c[act_key] not in ACTIVATIONS:
        raise _refuse(where, act_key, c[act_key], f"activations: {', '.join(ACTIVATIONS)}")


def _read(raw: dict, family: str, where: object, cls):
    c = DEFAULTS[family] | {k: v for k, v in raw.items() if v is not None or k in _NULL_MEANS}
    if "_sliding_window_pattern" in raw:  # how transformers 5.x saves it
        c["sliding_window_pattern"] = raw["_sliding_window_pattern"]
    _check_refused(c, family, where)
    heads = _required(c, "num_attention_heads", where)
    hidden = _required(c, "hidden_size", where)
    num_layers = _required(c, "num_hidden_layers", where)
    head_dim = c.get("head_dim") or hidden // heads
    kv_heads = c.get("num_key_value_heads") or heads
    if heads % kv_heads:
        raise ModelError(f"{where}: num_attention_heads={heads} is not a multiple of "
                         f"num_key_value_heads={kv_heads}")
    max_pos = c["max_position_embeddings"]
    layer_types = _layer_types(c, family, num_layers, where)
    ropes = _ropes(raw, c, family, layer_types, max_pos, where)
    window = _window(c, family, where)
    layers = tuple(LayerSpec(window if t == "sliding_attention" else None, ropes[t]) for t in layer_types)
    eos = c.get("eos_token_id")
    eos = () if eos is None else tuple(eos) if isinstance(eos, list) else (eos,)
    gemma = family == "gemma3"
    return cls(
        vocab_size=_required(c, "vocab_size", where), hidden_size=hidden, num_layers=num_layers,
        num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        intermediate_size=_required(c, "intermediate_size", where), rms_norm_eps=c["rms_norm_eps"],
        rope_theta=layers[0].rope.theta, max_position_embeddings=max_pos,
        tie_word_embeddings=bool(c["tie_word_embeddings"]),
        attention_bias=bool(c["attention_bias"]) and family not in ("mistral", "phi3"),
        o_bias=bool(c["attention_bias"]) and family in ("llama", "qwen3", "gemma3"),
        mlp_bias=bool(c["mlp_bias"]) and family == "llama",
        eos_token_ids=eos, bos_token_id=c.get("bos_token_id"),
        quantization=read_quant_config(raw, where), family=family, layers=layers,
        qk_norm=family in ("qwen3", "gemma3"), gemma_norms=gemma,
        activation=c["hidden_activation"] if gemma else c["hidden_act"],
        embed_scale=hidden ** 0.5 if gemma else None,
        attn_scale=c["query_pre_attn_scalar"] ** -0.5 if gemma else None,
        final_logit_softcapping=c.get("final_logit_softcapping") if gemma else None,
        fused_checkpoint=family == "phi3",
    )


def _layer_types(c: dict, family: str, num_layers: int, where: object) -> list[str]:
    """Each layer's attention type, as the family's config class derives it."""
    if family in ("llama", "mistral", "phi3"):
        # these models give every layer the same attention (Mistral and Phi-3 put the
        # window, when set, on all of them; their `layer_types` are not read by transformers)
        return ["sliding_attention" if family != "llama" and c.get("sliding_window") else
                "full_attention"] * num_layers
    types = c.get("layer_types")
    if types is None:
        if family == "gemma3":
            pattern = c["sliding_window_pattern"]
            types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(num_layers)]
        else:  # qwen2 / qwen3
            sliding = c["use_sliding_window"] and c.get("sliding_window") is not None
            types = ["sliding_attention" if sliding and i >= c["max_window_layers"] else "full_attention"
                     for i in range(num_layers)]
    if len(types) != num_layers:
        raise ModelError(f"{where}: layer_types has {len(types)} entries for {num_layers} layers")
    for t in types:
        if t not in LAYER_TYPES:
            raise _refuse(where, "layer_types", t, f"layer types: {', '.join(LAYER_TYPES)}")
    return list(types)


def _window(c: dict, family: str, where: object) -> int | None:
    if family == "llama":
        return None
    if family in ("qwen2", "qwen3") and not c["use_sliding_window"]:
        return None  # transformers drops the window (Qwen2.5 configs carry one unused)
    w = c.get("sliding_window")
    if w is not None and (not isinstance(w, int) or w < 1):
        raise _refuse(where, "sliding_window", w, "a window is a positive number of tokens")
    return w


def _nested(rope: dict) -> bool:
    """Whether RoPE parameters are keyed by layer type (5.x, as Gemma 3 writes them)."""
    return any(k in LAYER_TYPES for k in rope)


def _ropes(raw: dict, c: dict, family: str, layer_types: list[str], max_pos: int,
           where: object) -> dict[str, RopeSpec]:
    """The RoPE of each layer type, from `rope_parameters` (5.x) or `rope_scaling` +
    `rope_theta` (4.x), with transformers' precedence (rope_scaling, when set, wins)."""
    if family == "gemma3":
        rope = raw.get("rope_parameters")
        if not rope or not _nested(rope):
            # 4.x: rope_scaling applies to the full-attention layers, rope_local_base_freq
            # is the sliding ones' theta
            full = dict(raw.get("rope_scaling") or (rope if rope else {}) or {})
            full.setdefault("rope_theta", c["rope_theta"])
            rope = {"full_attention": full,
                    "sliding_attention": {"rope_theta": c["rope_local_base_freq"]}}
        else:
            rope = {k: dict(v or {}) for k, v in rope.items()}
            if raw.get("rope_scaling"):
                rope.setdefault("full_attention", {}).update(raw["rope_scaling"])
            rope.setdefault("full_attention", {}).setdefault("rope_theta", c["rope_theta"])
            rope.setdefault("sliding_attention", {}).setdefault("rope_theta", c["rope_local_base_freq"])
        return _per_layer_type(rope, c, layer_types, max_pos, where)
    rope = raw.get("rope_scaling") or raw.get("rope_parameters") or {}
    if _nested(rope):
        return _per_layer_type(rope, c, layer_types, max_pos, where)
    key = "rope_scaling" if raw.get("rope_scaling") else "rope_parameters"
    spec = _rope_spec(dict(rope), c, max_pos, key, where, outer=rope, flat=True)
    if family == "phi3" and spec.rope_type != "default":  # transformers' Phi3Config refuses them too
        raise _refuse(where, f"{key}.rope_type", spec.rope_type, "Phi-3 runs plain RoPE")
    return {t: spec for t in set(layer_types)}


def _per_layer_type(rope: dict, c: dict, layer_types: list[str], max_pos: int,
                    where: object) -> dict[str, RopeSpec]:
    specs = {}
    for t in set(layer_types):
        if rope.get(t) is None:  # transformers: no entry (or null) = a layer without RoPE
            raise _refuse(where, f"rope_parameters.{t}", rope.get(t), "every layer type needs its RoPE")
        specs[t] = _rope_spec(dict(rope[t]), c, max_pos, f"rope_parameters.{t}", where, outer=rope,
                              flat=False)
    return specs


def _rope_spec(p: dict, c: dict, max_pos: int, key: str, where: object, outer: dict,
               flat: bool) -> RopeSpec:
    kind = p.get("rope_type", p.get("type", "default"))
    if kind in ("longrope", "su"):
        raise _refuse(where, f"{key}.rope_type", kind, "LongRoPE (Phi-3 long-context) is not "
                      "implemented; the 4k-context Phi-3 checkpoints use plain RoPE")
    if kind not in ROPE_TYPES:
        raise _refuse(where, f"{key}.rope_type", kind, f"RoPE types: {', '.join(ROPE_TYPES)}")
    partial = p.get("partial_rotary_factor", c.get("partial_rotary_factor"))
    if partial not in (None, 1, 1.0):
        raise _refuse(where, f"{key}.partial_rotary_factor", partial, "RoPE on the whole head only")
    if p.get("mrope_section") is not None:
        raise _refuse(where, f"{key}.mrope_section", p["mrope_section"], "multimodal RoPE")
    theta = float(p.get("rope_theta", c["rope_theta"]))
    original = p.get("original_max_position_embeddings")
    if kind in ("llama3", "yarn"):
        # transformers: in a flat dict a top-level original_max_position_embeddings wins;
        # missing, it is max_position_embeddings
        top = c.get("original_max_position_embeddings") if flat else None
        original = top or original or max_pos
    try:
        if kind in ("linear", "dynamic", "llama3"):
            factor = float(p["factor"])
        else:
            factor = None if p.get("factor") is None else float(p["factor"])
        spec = RopeSpec(
            rope_type=kind, theta=theta, factor=factor, original_max_position_embeddings=original,
            low_freq_factor=p["low_freq_factor"] if kind == "llama3" else None,
            high_freq_factor=p["high_freq_factor"] if kind == "llama3" else None,
            attention_factor=p.get("attention_factor"), beta_fast=p.get("beta_fast"),
            beta_slow=p.get("beta_slow"), mscale=p.get("mscale"), mscale_all_dim=p.get("mscale_all_dim"),
            # transformers reads `truncate` from the outer dict (so per-layer-type ones are ignored)
            truncate=bool(outer.get("truncate", True)) if kind == "yarn" else True,
        )
    except KeyError as exc:
        raise ModelError(f"{where}: {key} of rope_type {kind!r} has no {exc.args[0]!r}") from None
    if kind == "yarn" and spec.factor is None and not original:
        raise ModelError(f"{where}: {key} of rope_type 'yarn' has neither 'factor' nor "
                         "'original_max_position_embeddings'")
    return spec
