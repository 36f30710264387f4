"""PEFT folders read and checked: what changes the math and is not implemented refuses the
adapter naming the key; slots, residency and LRU eviction; config refusals."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from inflight.engine import EngineConfig
from inflight.engine.errors import ConfigError
from inflight.engine.lora import LoraError, LoraManager, LoraSlots, load_adapter
from inflight.engine.model_config import ModelConfig
from tests.tiny_families import write_tiny_family

PREFIX = "base_model.model.model.layers"


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    path = write_tiny_family(tmp_path_factory.mktemp("llama"), "llama3")
    return path, ModelConfig.from_folder(path)


def write_adapter(path, tensors=None, r=4, **config):
    """A hand-written PEFT folder (q_proj and down_proj of layer 0 unless `tensors`)."""
    path.mkdir(parents=True, exist_ok=True)
    cfg = {"peft_type": "LORA", "r": r, "lora_alpha": 8, "target_modules": ["q_proj", "down_proj"],
           "bias": "none", "use_dora": False, "use_rslora": False, "modules_to_save": None} | config
    (path / "adapter_config.json").write_text(json.dumps(cfg))
    g = torch.Generator().manual_seed(0)
    if tensors is None:
        tensors = {f"{PREFIX}.0.self_attn.q_proj.lora_A.weight": torch.randn(r, 64, generator=g),
                   f"{PREFIX}.0.self_attn.q_proj.lora_B.weight": torch.randn(64, r, generator=g),
                   f"{PREFIX}.1.mlp.down_proj.lora_A.weight": torch.randn(r, 128, generator=g),
                   f"{PREFIX}.1.mlp.down_proj.lora_B.weight": torch.randn(64, r, generator=g)}
    save_file(tensors, str(path / "adapter_model.safetensors"))
    return path


def test_reads_modules_with_scaling(tmp_path, llama):
    _, cfg = llama
    a = load_adapter("x", write_adapter(tmp_path / "x"), cfg, max_rank=8)
    assert a.rank == 4 and len(a.modules) == 2
    q = next(m for m in a.modules if m.proj == "qkv")
    assert (q.layer, q.start, q.stop) == (0, 0, 64)
    raw = write_adapter(tmp_path / "y", use_rslora=True)
    b = load_adapter("y", raw, cfg, max_rank=8)
    qb = next(m for m in b.modules if m.proj == "qkv")
    torch.testing.assert_close(qb.b, q.b * (8 / 2) / (8 / 4))  # alpha/sqrt(r) against alpha/r


@pytest.mark.parametrize("key,value", [("use_dora", True), ("bias", "all"), ("modules_to_save", ["lm_head"]),
                                       ("fan_in_fan_out", True), ("target_modules", ["embed_tokens"]),
                                       ("peft_type", "IA3")])
def test_refuses_naming_the_key(tmp_path, llama, key, value):
    with pytest.raises(LoraError, match=key):
        load_adapter("x", write_adapter(tmp_path / "x", **{key: value}), llama[1], max_rank=8)


def test_refuses_embedding_tensors_rank_and_shapes(tmp_path, llama):
    cfg = llama[1]
    emb = {"base_model.model.model.embed_tokens.lora_embedding_A": torch.zeros(4, 320),
           "base_model.model.model.embed_tokens.lora_embedding_B": torch.zeros(64, 4)}
    with pytest.raises(LoraError, match="embedding"):
        load_adapter("x", write_adapter(tmp_path / "e", emb), cfg, max_rank=8)
    with pytest.raises(LoraError, match="max_lora_rank"):
        load_adapter("x", write_adapter(tmp_path / "r", r=4), cfg, max_rank=2)
    bad = {f"{PREFIX}.0.self_attn.q_proj.lora_A.weight": torch.zeros(4, 32),
           f"{PREFIX}.0.self_attn.q_proj.lora_B.weight": torch.zeros(64, 4)}
    with pytest.raises(LoraError, match="another model"):
        load_adapter("x", write_adapter(tmp_path / "s", bad), cfg, max_rank=8)
    fused = {f"{PREFIX}.0.self_attn.qkv_proj.lora_A.weight": torch.zeros(4, 64),
             f"{PREFIX}.0.self_attn.qkv_proj.lora_B.weight": torch.zeros(128, 4)}
    with pytest.raises(LoraError, match="qkv_proj"):
        load_adapter("x", write_adapter(tmp_path / "f", fused), cfg, max_rank=8)
    with pytest.raises(LoraError, match="adapter_config.json"):
        load_adapter("x", tmp_path / "nowhere", cfg, max_rank=8)


class Req:
    def __init__(self, lora):
        self.lora, self.lora_slot = lora, -1


def test_lru_eviction_never_evicts_a_used_adapter(tmp_path, llama):
    cfg = llama[1]
    slots = LoraSlots(cfg, 2, 4, torch.float32, torch.device("cpu"))
    m = LoraManager(cfg, slots, max_cpu_loras=2)
    for name in "abc":
        m.add(name, write_adapter(tmp_path / name))
    ra, rb, rc = Req("a"), Req("b"), Req("c")
    assert m.acquire(ra) and m.acquire(rb)
    assert not m.acquire(rc)  # both slots in use: c waits
    m.release(ra)
    assert m.acquire(rc) and rc.lora_slot == 0 and m.num_evictions == 1  # a was idle: evicted
    assert slots.used["qkv"][0][0] == 4
    m.release(rb)
    m.release(rc)
    assert m.acquire(Req("a")) and m.slot_of == {"c": 0, "a": 1}  # b, least recently used, went
    with pytest.raises(LoraError, match="unfinished"):
        m.remove("a")
    with pytest.raises(LoraError, match="already loaded"):
        m.add("c", tmp_path / "c")
    m.remove("c")
    assert "c" not in m and slots.used["qkv"][0][0] == 0


def test_config_refusals(tmp_path):
    with pytest.raises(ConfigError, match="tensor"):
        EngineConfig(model=tmp_path, max_loras=2, tensor_parallel_size=2)
    with pytest.raises(ConfigError, match="speculative"):
        EngineConfig(model=tmp_path, max_loras=2, speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    with pytest.raises(ConfigError, match="max_cpu_loras"):
        EngineConfig(model=tmp_path, max_loras=2, max_cpu_loras=1)
