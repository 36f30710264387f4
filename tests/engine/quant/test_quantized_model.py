"""A quantized tiny Llama loads through the normal engine and computes what `transformers`
computes on the same weights dequantized (tests/quant_models.py), through paged KV, the
prefix cache, chunked prefill, preemption and the padded (CUDA-graph) decode path."""

from __future__ import annotations

import pytest
import torch

from inflight.engine import Engine, EngineConfig, SamplingParams
from inflight.engine.model import AttentionMetadata
from inflight.engine.quant.linear import DenseLinear, W4Linear, W8Linear
from tests.quant_models import dequantized_reference, quantized

SCHEMES = {"w8": ("w8", None, "rtn"), "w4-g32": ("w4", 32, "rtn"), "w4-g64-gptq": ("w4", 64, "gptq")}
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module", params=list(SCHEMES))
def pair(request, tiny_model_path, tmp_path_factory):
    """(quantized folder, dequantized HF twin) per scheme."""
    root = tmp_path_factory.mktemp(request.param)
    q = quantized(tiny_model_path, root / "q", *SCHEMES[request.param])
    return request.param, q, dequantized_reference(q, root / "ref")


def engine_logits(eng: Engine, ids: list[int]) -> torch.Tensor:
    """fp32 logits of every position of one sequence through the engine's own forward."""
    model, bs = eng.model, eng.block_size
    t = len(ids)
    blocks = -(-t // bs)
    meta = AttentionMetadata(slot_mapping=torch.arange(t), block_tables=torch.arange(blocks, dtype=torch.int32)[None],
                             seq_lens=torch.tensor([t], dtype=torch.int32),
                             query_start_loc=torch.tensor([0, t], dtype=torch.int32))
    with torch.inference_mode():
        return model.forward(torch.tensor(ids), torch.arange(t), meta, eng.runner.kv_caches, torch.arange(t))


def hf_logits(path, ids: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0].float()


def test_quantized_folder_loads_quantized_layers(pair):
    name, q, _ = pair
    eng = Engine(EngineConfig(model=q, num_kv_blocks=16))
    layer = eng.model.layers[0]
    kind = W8Linear if name == "w8" else W4Linear
    assert all(isinstance(lin, kind) for lin in (layer.qkv, layer.o, layer.gate_up, layer.down))
    assert eng.model.config.quantization.scheme == name[:2]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_logits_match_dequantized_transformers(pair, prompts, dtype):
    """fp32: the engine dequantizes on the fly, the reference's math (tight). bf16: torch's
    packed int kernels for few rows (a 5-token prompt), dequantize + bf16 matmul for more
    (40 tokens, w8): within bf16 noise, which on this peaked random model reaches ~6% of the
    largest logit for the *dense* bf16 engine too (the CPU paths alone are tested tightly in
    tests/kernels/test_quant_cpu.py)."""
    _, q, ref = pair
    eng = Engine(EngineConfig(model=q, dtype=dtype, num_kv_blocks=16))
    for ids in (max(prompts, key=len), prompts[0][:5]):
        got, want = engine_logits(eng, ids), hf_logits(ref, ids)
        scale = want.abs().max()
        if dtype == "float32":
            torch.testing.assert_close(got, want, atol=1e-4 * scale, rtol=1e-4)
        else:
            assert (got - want).abs().max() < 0.12 * scale
            assert (got.argmax(-1) == want.argmax(-1)).float().mean() > 0.9


@pytest.mark.parametrize("kw", [
    pytest.param({"max_num_batched_tokens": 16, "block_size": 4}, id="chunked-prefill"),
    pytest.param({"num_kv_blocks": 12, "max_num_batched_tokens": 64}, id="preemption"),
    pytest.param({"cuda_graphs": True, "overlap_outputs": True}, id="padded-decode-overlapped"),
])
def test_greedy_tokens_match_transformers_through_the_whole_engine(pair, prompts, hf_ref, kw):
    _, q, ref = pair
    kw.setdefault("num_kv_blocks", 128)
    eng = Engine(EngineConfig(model=q, debug_checks=True, **kw))
    shared = prompts[3] + prompts[5]  # a second request that starts from cached blocks
    batch = prompts[:8] + [shared, shared[:-2] + [7, 8]]
    outs = eng.generate(batch, GREEDY)
    assert [o.token_ids for o in outs] == [hf_ref.greedy(ref, p, 12) for p in batch]
    stats = eng.stats()
    assert stats["prefix_cache_hit_tokens"] > 0
    if "num_kv_blocks" in kw and kw["num_kv_blocks"] == 12:
        assert stats["preemptions"] > 0


def test_unquantized_folder_builds_dense_layers(tiny_model_path):
    eng = Engine(EngineConfig(model=tiny_model_path, num_kv_blocks=16))
    assert isinstance(eng.model.layers[0].qkv, DenseLinear)
    assert eng.model.config.quantization is None
