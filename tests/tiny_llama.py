"""A tiny random Llama checkpoint on disk, built offline, for tests that need a real model folder.

    path = write_tiny_llama(tmp_path / "tiny", num_layers=2, hidden_size=64)

writes config.json, model.safetensors, tokenizer.json, tokenizer_config.json (ChatML
template) and generation_config.json: a `LlamaForCausalLM` with random weights and a
word-level tokenizer trained on a few sentences (EOS = "</s>", id 1). Weights are scaled
up from HF's tiny init so the logits are peaked: greedy decoding then has clear winners
and fp32/bf16 comparisons against `transformers` do not hinge on near-ties.
"""

from __future__ import annotations

import json
import pathlib

SENTENCES = [
    "the quick brown fox jumps over the lazy dog",
    "a paged kv cache stores keys and values in fixed size blocks",
    "continuous batching lets new requests join while others are still decoding",
    "kafka carries prompts to workers and results back to the store",
    "hello world this is a tiny test model with a tiny vocabulary",
    "one two three four five six seven eight nine ten eleven twelve",
    "red green blue yellow purple orange black white grey pink",
    "ünïcödé wörds and emoji 🙂 live here too",
]
SPECIAL_TOKENS = ["<unk>", "</s>", "<s>", "<|im_start|>", "<|im_end|>"]
CHATML_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
                   "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
                   "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def build_tokenizer(vocab_size: int):
    """A byte-level BPE tokenizer with at most `vocab_size` tokens (>= 300 recommended, so
    every byte has a token and any text round-trips)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(SENTENCES * 4, trainer=trainer)
    return tok


def write_tiny_llama(path, *, vocab_size: int = 320, num_layers: int = 2, hidden_size: int = 64,
                     num_heads: int = 4, num_kv_heads: int = 2, head_dim: int | None = None,
                     intermediate_size: int | None = None, tie_word_embeddings: bool = True,
                     rope_theta: float = 10000.0, max_position_embeddings: int = 512,
                     seed: int = 0, weight_scale: float = 8.0,
                     tokenizer_from: str | pathlib.Path | None = None) -> pathlib.Path:
    """Write a random LlamaForCausalLM HF folder to `path` and return it. `head_dim` defaults
    to hidden_size // num_heads; `weight_scale` multiplies HF's random init.
    `tokenizer_from`: a model folder whose tokenizer files (and vocabulary size, EOS and BOS
    ids) the tiny model takes instead of its own small tokenizer (a real model's tokenizer,
    for tests that depend on it)."""
    import shutil

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)
    bos, eos = 2, 1
    if tokenizer_from is not None:
        src = pathlib.Path(tokenizer_from)
        cfg = json.loads((src / "config.json").read_text())
        vocab_size, bos, eos = cfg["vocab_size"], cfg.get("bos_token_id", bos), cfg.get("eos_token_id", eos)
        tok = None
    else:
        tok = build_tokenizer(vocab_size)
        assert tok.get_vocab_size() <= vocab_size, tok.get_vocab_size()
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_layers,
        num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        head_dim=head_dim or hidden_size // num_heads,
        intermediate_size=intermediate_size or 2 * hidden_size,
        tie_word_embeddings=tie_word_embeddings, rope_theta=rope_theta,
        max_position_embeddings=max_position_embeddings, bos_token_id=bos, eos_token_id=eos,
        pad_token_id=0, rms_norm_eps=1e-5, torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.8, 1.2)
            elif "embed" in name or "lm_head" in name:
                p.normal_(0.0, 1.0)
            else:
                p.normal_(0.0, weight_scale / (p.shape[-1] ** 0.5) / 4)
    model.save_pretrained(path, safe_serialization=True)
    if tok is None:
        for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            if (src / name).is_file():
                shutil.copy(src / name, path / name)
        return path
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": "</s>", "bos_token": "<s>", "unk_token": "<unk>", "pad_token": "<unk>",
        "chat_template": CHATML_TEMPLATE, "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_position_embeddings,
    }))
    return path


def tiny_prompts(n: int, *, vocab_size: int = 320, min_len: int = 3, max_len: int = 40,
                 seed: int = 0) -> list[list[int]]:
    """`n` random token-id prompts of different lengths (ids 5..vocab_size-1, no specials)."""
    import random

    rng = random.Random(seed)
    lengths = [min_len + (i * (max_len - min_len)) // max(n - 1, 1) for i in range(n)]
    rng.shuffle(lengths)
    return [[rng.randrange(5, vocab_size) for _ in range(L)] for L in lengths]
