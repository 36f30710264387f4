"""Tiny random checkpoints of every supported family, built by transformers' own config and
model classes (so their config.json is what transformers writes), for exactness tests and
benchmarks/models.py.

    path = write_tiny_family(tmp_path / "m", "gemma3")
    path = write_tiny_family(tmp_path / "m", "llama3")   # a FAMILIES key: family + config

Every model has 2 layers, hidden 64, the byte-level test tokenizer of tests/tiny_llama.py,
and sliding windows of 8-12 tokens where the family has them, so 20-90-token prompts
exceed them. Weights are scaled like tiny_llama's (peaked logits, few near-ties).
"""

from __future__ import annotations

import json
import pathlib

from tests.tiny_llama import CHATML_TEMPLATE, build_tokenizer

VOCAB = 320
BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
            bos_token_id=2, eos_token_id=1, pad_token_id=0)

# name -> (transformers config class, model class, config overrides)
FAMILIES: dict[str, tuple[str, str, dict]] = {
    "llama3": ("LlamaConfig", "LlamaForCausalLM", dict(
        rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                             high_freq_factor=4.0, original_max_position_embeddings=64),
        tie_word_embeddings=True)),
    "llama-linear": ("LlamaConfig", "LlamaForCausalLM", dict(
        rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=4.0))),
    "llama-dynamic": ("LlamaConfig", "LlamaForCausalLM", dict(
        rope_parameters=dict(rope_type="dynamic", rope_theta=10000.0, factor=2.0))),
    "llama-yarn": ("LlamaConfig", "LlamaForCausalLM", dict(
        max_position_embeddings=256,
        rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                             original_max_position_embeddings=64))),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    "qwen2-sliding": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        use_sliding_window=True, sliding_window=12, max_window_layers=1)),
    "qwen2.5-yarn": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        max_position_embeddings=256,
        rope_parameters=dict(rope_type="yarn", rope_theta=1000000.0, factor=4.0,
                             original_max_position_embeddings=64))),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=32, tie_word_embeddings=True)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=10)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        head_dim=32, query_pre_attn_scalar=24, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": dict(rope_type="default", rope_theta=10000.0),
                         "full_attention": dict(rope_type="linear", rope_theta=1000000.0, factor=2.0)})),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(pad_token_id=0)),
}
SLIDING = ("qwen2-sliding", "mistral", "gemma3")


def write_tiny_family(path, name: str, *, seed: int = 0, weight_scale: float = 8.0,
                      embed_std: float | None = None, **overrides) -> pathlib.Path:
    """Write a random checkpoint of FAMILIES[name] (plus `overrides` on its config) to
    `path` and return it."""
    import torch
    import transformers

    config_cls, model_cls, family_kw = FAMILIES[name]
    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = getattr(transformers, config_cls)(**(BASE | family_kw | overrides))
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).eval()
    gemma = config_cls.startswith("Gemma")
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname:
                # Gemma scales by (1 + w): 1.5-2.5, so that the normalised attention and
                # MLP outputs outweigh the (scaled) embedding in the residual stream
                p.uniform_(0.5, 1.5) if gemma else p.uniform_(0.8, 1.2)
            elif "embed" in pname or "lm_head" in pname:
                # Gemma multiplies embeddings by sqrt(hidden): with N(0, 1) ones (tied to
                # the LM head) every greedy step would repeat its input token
                p.normal_(0.0, embed_std if embed_std is not None else 0.1 if gemma else 1.0)
            elif pname.endswith("bias"):
                p.normal_(0.0, 0.5)
            else:
                p.normal_(0.0, weight_scale / (p.shape[-1] ** 0.5) / 4)
    model.save_pretrained(path, safe_serialization=True)
    tok = build_tokenizer(VOCAB)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": "</s>", "bos_token": "<s>", "unk_token": "<unk>", "pad_token": "<unk>",
        "chat_template": CHATML_TEMPLATE, "tokenizer_class": "PreTrainedTokenizerFast",
    }))
    return path
