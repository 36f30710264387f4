"""LoRA adapters token by token against transformers + peft (PeftModel, unmerged): one
mixed batch of the base model and three adapters of different ranks and targets, on the
tiny Llama, Qwen3 and Phi-3 (fused qkv_proj / gate_up_proj) families, under chunked
prefill, preemption, prefix caching, and more adapters than slots (LRU eviction, re-reads
from disk)."""

from __future__ import annotations

import random

import pytest
import torch

from inflight.engine import Engine, EngineConfig, SamplingParams
from tests.lora_adapters import write_peft_adapter
from tests.tiny_families import VOCAB, write_tiny_family

N = 10
GREEDY = SamplingParams(max_tokens=N, temperature=0.0, ignore_eos=True)
UNFUSED = {"qkv": ["q_proj", "k_proj", "v_proj"], "o": ["o_proj"], "gate_up": ["gate_proj", "up_proj"],
           "down": ["down_proj"]}
FUSED = {"qkv": ["qkv_proj"], "o": ["o_proj"], "gate_up": ["gate_up_proj"], "down": ["down_proj"]}


def adapter_specs(fused: bool) -> dict[str, dict]:
    m = FUSED if fused else UNFUSED
    return {
        "a": dict(r=8, lora_alpha=16, target_modules=m["qkv"][:1] + m["qkv"][-1:], seed=1),
        "b": dict(r=4, lora_alpha=8, use_rslora=True, target_modules=m["o"] + m["down"] + m["gate_up"][:1],
                  seed=2),
        "c": dict(r=2, lora_alpha=4, target_modules=sum(m.values(), []), seed=3,
                  alpha_pattern={m["down"][0]: 8}),
    }


def prompts() -> list[list[int]]:
    rng = random.Random(0)
    ids = lambda n: [rng.randrange(5, VOCAB) for _ in range(n)]  # noqa: E731
    shared = ids(24)
    return [shared + ids(9), shared + ids(3)]


def hf_greedy(model, prompt):
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=N, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("family,deltas", [("llama3", "native"), ("qwen3", "native"), ("phi3", "native"),
                                         ("llama3", "torch"), ("phi3", "torch")])
def test_mixed_batch_matches_peft(tmp_path, family, deltas, monkeypatch):
    """`deltas`: the CPU deltas through the C++ kernel (where it builds) or the torch ops."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    base_path = write_tiny_family(tmp_path / "base", family)
    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32).eval()
    specs = adapter_specs(fused=family == "phi3")
    paths = {name: write_peft_adapter(tmp_path / name, base_path, base_model=base, **spec)
             for name, spec in specs.items()}
    ps = prompts()
    refs = {(None, i): hf_greedy(base, p) for i, p in enumerate(ps)}
    peft = PeftModel.from_pretrained(base, paths["a"], adapter_name="a").eval()
    for name in ("b", "c"):
        peft.load_adapter(paths[name], adapter_name=name)
    for name in specs:
        peft.set_adapter(name)
        for i, p in enumerate(ps):
            refs[(name, i)] = hf_greedy(peft, p)
    for name in specs:  # each adapter changes the tokens (else the check proves little)
        assert any(refs[(name, i)] != refs[(None, i)] for i in range(len(ps))), name

    # 2 slots for 3 adapters (eviction), 2 kept on the host (re-reads), blocks for fewer
    # than all 8 requests (preemption), 16-token steps (chunked prefill)
    if deltas == "torch":
        monkeypatch.setattr("inflight.kernels.lora.native_lora", lambda: None)
    engine = Engine(EngineConfig(model=base_path, block_size=4, num_kv_blocks=24, max_num_seqs=8,
                                 max_num_batched_tokens=16, max_loras=2, max_lora_rank=8,
                                 max_cpu_loras=2, debug_checks=True))
    for name, path in paths.items():
        engine.add_lora(name, path)
    keys = [(name, i) for name in (None, *specs) for i in range(len(ps))]
    for j, (name, i) in enumerate(keys):
        engine.add_request(f"r{j}", prompt_token_ids=ps[i], params=GREEDY, lora=name)
    finals = {}
    for _ in range(2000):
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
        if not engine.has_unfinished():
            break
    from inflight.kernels.lora import native_lora  # (the patched one for "torch")

    slots = engine.model.lora
    assert slots.native is None if deltas == "torch" else (slots.native is not None) == (
        not slots.kernel and native_lora() is not None)
    got = {key: finals[f"r{j}"].token_ids for j, key in enumerate(keys)}
    assert all(finals[f"r{j}"].finish_reason == "length" for j in range(len(keys)))
    assert got == {key: refs[key] for key in keys}
    stats = engine.stats()
    assert engine.scheduler.num_preemptions > 0
    assert stats["lora_evictions"] > 0 and stats["lora_loads"] >= 3
    assert stats["prefix_cache_hit_rate"] > 0
