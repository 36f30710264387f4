"""Reading config.json: RoPE variants equal transformers' bit for bit, both RoPE spellings,
sliding windows per layer, and a ModelError naming the key for any math-changing key the
engine does not implement (walking the families' transformers config classes)."""

from __future__ import annotations

import json

import pytest
import torch

from inflight.engine.errors import ModelError
from inflight.engine.model_config import FAMILY_ONLY_REFUSED, INERT, READ, REFUSED, ModelConfig
from inflight.engine.rope import RopeSpec, inv_freq_and_scale

SMALL = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
CLASSES = {  # family -> (config class, architecture)
    "llama": ("LlamaConfig", "LlamaForCausalLM"), "mistral": ("MistralConfig", "MistralForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"), "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM"), "phi3": ("Phi3Config", "Phi3ForCausalLM"),
}


def hf_config(family: str, **kw):
    import transformers

    return getattr(transformers, CLASSES[family][0])(**(SMALL | kw))


def as_json(config, family: str) -> dict:
    """What save_pretrained writes into config.json."""
    d = json.loads(config.to_json_string())
    d["architectures"] = [CLASSES[family][1]]
    return d


def read(d: dict) -> ModelConfig:
    return ModelConfig.from_dict(d, "test")


# -- RoPE: the engine's inverse frequencies and attention factor are transformers' ----------
ROPES = [
    ("llama", dict(rope_type="default", rope_theta=500000.0)),
    ("llama", dict(rope_type="linear", rope_theta=10000.0, factor=4.0)),
    ("llama", dict(rope_type="dynamic", rope_theta=10000.0, factor=3.0)),
    ("llama", dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                   high_freq_factor=4.0, original_max_position_embeddings=64)),
    ("llama", dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=128)),
    ("qwen2", dict(rope_type="yarn", rope_theta=1e6, factor=4.0, original_max_position_embeddings=128,
                   beta_fast=16, beta_slow=2, truncate=False)),
    ("qwen3", dict(rope_type="yarn", rope_theta=1e6, factor=2.0, original_max_position_embeddings=256,
                   mscale=1.0, mscale_all_dim=0.5)),
    ("mistral", dict(rope_type="yarn", rope_theta=1e6, factor=8.0, original_max_position_embeddings=64,
                     attention_factor=1.25)),
]


@pytest.mark.parametrize("family,rope", ROPES, ids=lambda x: x if isinstance(x, str) else x["rope_type"])
def test_rope_equals_transformers(family, rope):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = hf_config(family, rope_parameters=dict(rope))
    cfg = read(as_json(config, family))
    spec = cfg.layers[0].rope
    assert spec.rope_type == rope["rope_type"]
    got, scale = inv_freq_and_scale(spec, cfg.head_dim, cfg.max_position_embeddings)
    if rope["rope_type"] == "default":
        want = 1.0 / (rope["rope_theta"] ** (torch.arange(0, 16, 2, dtype=torch.int64).float() / 16))
        want_scale = 1.0
    else:
        want, want_scale = ROPE_INIT_FUNCTIONS[rope["rope_type"]](config, "cpu")
    assert torch.equal(got, want)
    assert scale == want_scale


def test_gemma3_rope_per_layer_type_equals_transformers():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {"sliding_attention": dict(rope_type="default", rope_theta=10000.0),
            "full_attention": dict(rope_type="yarn", rope_theta=1e6, factor=8.0,
                                   original_max_position_embeddings=64)}
    config = hf_config("gemma3", rope_parameters=rope, layer_types=["sliding_attention"] * 3 + ["full_attention"])
    cfg = read(as_json(config, "gemma3"))
    assert [l.rope.rope_type for l in cfg.layers] == ["default"] * 3 + ["yarn"]
    got, scale = inv_freq_and_scale(cfg.layers[3].rope, cfg.head_dim, cfg.max_position_embeddings)
    want, want_scale = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu", layer_type="full_attention")
    assert torch.equal(got, want) and scale == want_scale
    assert cfg.layers[0].rope.theta == 10000.0 and cfg.layers[0].sliding_window == 4096


def test_rope_scaling_and_rope_parameters_spellings_agree():
    """A 4.x config.json (rope_scaling + rope_theta) reads as its 5.x form."""
    new = read(as_json(hf_config("llama", rope_parameters=dict(
        rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
        high_freq_factor=4.0, original_max_position_embeddings=64)), "llama"))
    old = dict(SMALL, architectures=["LlamaForCausalLM"], rope_theta=500000.0, rope_scaling=dict(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=64))
    assert read(old) == new
    old["rope_scaling"]["type"] = old["rope_scaling"].pop("rope_type")  # the oldest spelling
    assert read(old) == new


def test_gemma3_4x_spelling():
    """Gemma 3's 4.x config: rope_scaling for the full layers, rope_local_base_freq for the
    sliding ones (as transformers converts it)."""
    old = dict(SMALL, architectures=["Gemma3ForCausalLM"], rope_theta=1e6, rope_local_base_freq=1e4,
               rope_scaling=dict(rope_type="linear", factor=8.0), sliding_window=512,
               layer_types=["sliding_attention"] * 3 + ["full_attention"])
    cfg = read(old)
    import transformers

    hf = transformers.Gemma3TextConfig(**{k: v for k, v in old.items() if k != "architectures"})
    assert cfg == read(as_json(hf, "gemma3"))
    assert cfg.layers[3].rope == RopeSpec("linear", 1e6, factor=8.0)
    assert cfg.layers[0].rope == RopeSpec("default", 1e4) and cfg.sliding_windows == (512,) * 3 + (None,)


def test_sliding_windows_per_family():
    assert read(as_json(hf_config("mistral", sliding_window=16), "mistral")).sliding_windows == (16,) * 4
    assert read(as_json(hf_config("mistral", sliding_window=None), "mistral")).sliding_windows == (None,) * 4
    # Qwen2.5 configs carry a window that transformers drops unless use_sliding_window
    assert read(as_json(hf_config("qwen2", sliding_window=131072), "qwen2")).sliding_windows == (None,) * 4
    qwen = read(as_json(hf_config("qwen2", use_sliding_window=True, sliding_window=32,
                                  max_window_layers=2), "qwen2"))
    assert qwen.sliding_windows == (None, None, 32, 32)
    raw = dict(SMALL, architectures=["Qwen2ForCausalLM"], use_sliding_window=True, sliding_window=32,
               max_window_layers=1)  # no layer_types: derived as the config class does
    assert read(raw).sliding_windows == (None, 32, 32, 32)
    raw = dict(SMALL, architectures=["Gemma3ForCausalLM"], sliding_window=8)  # pattern 6, 4 layers
    assert read(raw).sliding_windows == (8, 8, 8, 8)
    assert read(as_json(hf_config("phi3", sliding_window=2047), "phi3")).sliding_windows == (2047,) * 4
    # a Llama has no window, whatever its file says (transformers' Llama reads none)
    assert read(dict(SMALL, architectures=["LlamaForCausalLM"], sliding_window=8)).sliding_windows == (None,) * 4


def test_family_details():
    gemma = read(as_json(hf_config("gemma3", head_dim=32, query_pre_attn_scalar=24), "gemma3"))
    assert gemma.scale == 24 ** -0.5 and gemma.embed_scale == 8.0 and gemma.activation == "gelu_pytorch_tanh"
    assert gemma.qk_norm and gemma.gemma_norms and gemma.tie_word_embeddings
    qwen3 = read(dict(SMALL, architectures=["Qwen3ForCausalLM"]))
    assert qwen3.head_dim == 128 and qwen3.qk_norm and not qwen3.attention_bias  # the class default
    assert read(dict(SMALL, architectures=["Qwen2ForCausalLM"])).attention_bias
    assert read(as_json(hf_config("phi3"), "phi3")).fused_checkpoint


# -- refusals ------------------------------------------------------------------------------
def refused(d: dict, key: str) -> None:
    with pytest.raises(ModelError) as exc:
        read(d)
    assert repr(key) in str(exc.value), str(exc.value)


BAD = {  # a value of each REFUSED key that changes the math
    "partial_rotary_factor": 0.5, "rotary_pct": 0.25, "attn_logit_softcapping": 50.0,
    "use_bidirectional_attention": True, "alibi": True, "use_alibi": True,
    "position_embedding_type": "alibi", "num_experts": 8, "num_local_experts": 8,
    "n_routed_experts": 64, "moe_intermediate_size": 512, "num_experts_per_tok": 2,
    "attention_chunk_size": 8192, "no_rope_layers": [1, 0], "no_rope_layer_interval": 4,
    "use_qk_norm": True, "qk_layernorm": True, "clip_qkv": 8.0, "embedding_multiplier": 12.0,
    "residual_multiplier": 0.22, "attention_multiplier": 0.0078, "logits_scaling": 8.0,
    "logit_scale": 0.0625, "parallel_attn": True, "use_parallel_residual": True,
    "sliding_window_layers": [0, 1], "global_attn_every_n_layers": 3,
}


@pytest.mark.parametrize("family", list(CLASSES))
def test_every_config_class_field_is_classified(family):
    """Each field transformers' config class has is read, inert, or refused: a field a
    new transformers adds fails here before the engine can ignore it."""
    fields = set(hf_config(family).to_dict())
    unknown = fields - READ - INERT - set(REFUSED) - set(FAMILY_ONLY_REFUSED)
    assert not unknown, f"{family}: classify {sorted(unknown)} in engine/model_config.py"


@pytest.mark.parametrize("family", list(CLASSES))
def test_each_refused_key_flipped_is_named(family):
    base = as_json(hf_config(family), family)
    read(base)  # the class's own defaults load
    assert set(BAD) == set(REFUSED)
    for key, value in BAD.items():
        refused(base | {key: value}, key)
    for key, families in FAMILY_ONLY_REFUSED.items():
        if family not in families:
            refused(base | {key: 30.0}, key)
    act = "hidden_activation" if family == "gemma3" else "hidden_act"
    refused(base | {act: "relu2"}, act)


@pytest.mark.parametrize("family", list(CLASSES))
def test_each_read_field_flipped_changes_the_model(family):
    """Every math field of the class that is read here changes the ModelConfig when it
    changes (none is read and then dropped)."""
    base = as_json(hf_config(family), family)
    flips = dict(rms_norm_eps=1e-3, hidden_size=128, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=8, num_key_value_heads=1, head_dim=32, max_position_embeddings=256,
                 tie_word_embeddings=not base.get("tie_word_embeddings"), vocab_size=400,
                 attention_bias=not base.get("attention_bias"), mlp_bias=True,
                 query_pre_attn_scalar=32, sliding_window=7)
    if family == "phi3":
        flips["head_dim"] = 8  # Phi3Config has no head_dim field; a file's is read
    changed = []
    for key, value in flips.items():
        if key not in base and not (family == "phi3" and key == "head_dim"):
            continue
        if family in ("qwen2", "qwen3") and key == "sliding_window":
            value = dict(use_sliding_window=True, sliding_window=7, max_window_layers=0, layer_types=None)
        elif family in ("mistral", "qwen2", "qwen3", "phi3") and key == "attention_bias":
            if family in ("mistral", "phi3", "qwen2"):
                continue  # fixed by the family's model code, whatever the file says
        d = base | (value if isinstance(value, dict) else {key: value})
        if key == "num_hidden_layers" and "layer_types" in d:
            d["layer_types"] = d["layer_types"][:value]
        if read(d) == read(base):
            changed.append(key)
    assert not changed, f"{family}: flipping {changed} leaves the ModelConfig unchanged"


@pytest.mark.parametrize("family,rope,key", [
    ("phi3", dict(rope_type="longrope", short_factor=[1.0] * 8, long_factor=[2.0] * 8,
                  original_max_position_embeddings=4096), "rope_parameters.rope_type"),
    ("llama", dict(rope_type="longrope", short_factor=[1.0] * 8, long_factor=[2.0] * 8,
                   original_max_position_embeddings=64, factor=4.0), "rope_parameters.rope_type"),
    ("llama", dict(rope_type="proportional", rope_theta=1e4, partial_rotary_factor=0.5),
     "rope_parameters.rope_type"),
    ("qwen2", dict(rope_type="default", rope_theta=1e4, partial_rotary_factor=0.5),
     "rope_parameters.partial_rotary_factor"),
    ("llama", dict(rope_type="dynamic", rope_theta=1e4, factor=2.0, mrope_section=[2, 3, 3]),
     "rope_parameters.mrope_section"),
])
def test_rope_refusals_name_the_key(family, rope, key):
    d = as_json(hf_config(family), family) | {"rope_parameters": rope}
    refused(d, key)
    value = rope[key.rsplit(".", 1)[1]]
    with pytest.raises(ModelError, match=repr(value).replace("[", r"\[").replace("]", r"\]")):
        read(d)


def test_other_refusals():
    raw = dict(SMALL, architectures=["Phi3ForCausalLM"], rope_scaling=dict(type="su", short_factor=[1.0],
                                                                          long_factor=[1.0]))
    refused(raw, "rope_scaling.rope_type")  # Phi-3-128k's old spelling of longrope
    refused(dict(SMALL, architectures=["Qwen2ForCausalLM"],
                 layer_types=["full_attention", "chunked_attention"] * 2), "layer_types")
    refused(dict(SMALL, architectures=["Phi3ForCausalLM"], rope_scaling=dict(type="linear", factor=2.0)),
            "rope_scaling.rope_type")
    refused(dict(SMALL, architectures=["Qwen2ForCausalLM"], rope_parameters={
        "full_attention": dict(rope_type="default", rope_theta=1e6), "sliding_attention": None},
        layer_types=["full_attention", "sliding_attention"] * 2, use_sliding_window=True),
        "rope_parameters.sliding_attention")  # transformers: a layer type without RoPE
    with pytest.raises(ModelError, match="Gemma3ForConditionalGeneration"):
        read(dict(SMALL, architectures=["Gemma3ForConditionalGeneration"]))
    with pytest.raises(ModelError, match="'quantization_config'|another tool"):
        read(dict(SMALL, architectures=["LlamaForCausalLM"], quantization_config=dict(quant_method="awq")))


def test_max_context():
    qwen = dict(SMALL, architectures=["Qwen2ForCausalLM"], max_position_embeddings=32768,
                rope_scaling=dict(type="yarn", factor=4.0, original_max_position_embeddings=32768))
    assert read(qwen).max_context == 131072
    llama3 = as_json(hf_config("llama", max_position_embeddings=131072, rope_parameters=dict(
        rope_type="llama3", rope_theta=5e5, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=8192)), "llama")
    assert read(llama3).max_context == 131072
    dynamic = as_json(hf_config("llama", rope_parameters=dict(rope_type="dynamic", rope_theta=1e4,
                                                              factor=4.0)), "llama")
    assert read(dynamic).max_context == 512  # where dynamic NTK equals transformers' exactly
