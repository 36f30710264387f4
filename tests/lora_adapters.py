"""Random PEFT LoRA adapters for tests and benchmarks, built by `peft` itself (so their
adapter_config.json and tensor names are what peft writes): B is random and non-zero
(init_lora_weights=False), scaled so that the adapter changes greedy tokens.

    path = write_peft_adapter(tmp_path / "a", base_folder, r=8, target_modules=["q_proj"])
"""

from __future__ import annotations

import pathlib


def write_peft_adapter(path, base_folder, *, r: int = 8, lora_alpha: float = 16,
                       target_modules=("q_proj", "v_proj"), seed: int = 0, b_scale: float = 4.0,
                       base_model=None, **config) -> pathlib.Path:
    """Write a random LoRA adapter of the model in `base_folder` (or of `base_model`, a
    transformers model that is left unchanged) to `path`."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    path = pathlib.Path(path)
    base = base_model if base_model is not None else \
        AutoModelForCausalLM.from_pretrained(base_folder, dtype=torch.float32)
    torch.manual_seed(seed)
    cfg = LoraConfig(r=r, lora_alpha=lora_alpha, target_modules=list(target_modules),
                     init_lora_weights=False, lora_dropout=0.0, **config)
    model = get_peft_model(base, cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(b_scale)
    model.save_pretrained(path, safe_serialization=True)
    if base_model is not None:
        model.unload()  # take the LoRA layers back out of the caller's model
    return path
