"""The engine on a tiny random Llama gives the same greedy tokens with the Triton kernels
(EngineConfig.kernels) as with the torch path: on CUDA when there is a GPU,
else on CPU under the Triton interpreter.

Small blocks and a small step budget make the steps mixed: chunked prefills beside
decodes, a prefix shared between two prompts through the prefix cache, contexts that end
mid-block and on block edges.
"""

import pytest
import torch

from tests.tiny_llama import write_tiny_llama

engine = pytest.importorskip("inflight.engine")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

PROMPTS = [
    "the quick brown fox jumps over the lazy dog and the quick brown fox",
    "the quick brown fox jumps over the lazy dog and then",            # shares a prefix
    "hello world",
    "kafka carries prompts to workers",
]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("tiny") / "llama", num_layers=2, hidden_size=64,
                            num_heads=4, num_kv_heads=2)


def run(model, kernels, kv_cache_dtype="auto"):
    config = engine.EngineConfig(model=model, kernels=kernels, block_size=4, num_kv_blocks=64,
                                 max_num_batched_tokens=16, max_num_seqs=4, dtype="float32",
                                 device=DEVICE, kv_cache_dtype=kv_cache_dtype)
    eng = engine.Engine(config)
    assert eng.ops.name == (kernels or "triton")
    params = engine.SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    # The first prompt alone, then all: prompts 0 and 1 then start from cached blocks.
    tokens = [out.token_ids for out in eng.generate(PROMPTS[:1], params)]
    tokens += [out.token_ids for out in eng.generate(PROMPTS, params)]
    assert eng.stats()["prefix_cache_hit_tokens"] >= 8
    return tokens


def test_greedy_tokens_match_torch(tiny_model):
    expected = run(tiny_model, "torch")
    got = run(tiny_model, "triton")
    assert got == expected
    assert len(got) == 5 and all(len(t) == 6 for t in got)


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "fp8"])
def test_8bit_kv_cache_tokens_match_torch(tiny_model, kv_cache_dtype):
    """The Triton KV write and attention on an 8-bit cache (kernels/kv_quant.py) = the
    torch path on the same cache: same quantized bytes, same tokens."""
    expected = run(tiny_model, "torch", kv_cache_dtype)
    assert run(tiny_model, "triton", kv_cache_dtype) == expected


@pytest.mark.parametrize("family", ["gemma3"])
def test_sliding_families_match_torch(family, tmp_path, monkeypatch):
    """A family with per-layer windows (Gemma 3: an 8-token window on one layer, q/k norms,
    32-dim heads, two RoPE tables), contexts past the window, through the Triton kernels."""
    from tests.tiny_families import write_tiny_family

    path = write_tiny_family(tmp_path / family, family)
    ids = [[(7 * i + 3 * j) % 300 + 5 for j in range(n)] for i, n in enumerate((30, 21, 3))]

    def tokens(kernels):
        eng = engine.Engine(engine.EngineConfig(model=path, kernels=kernels, block_size=4,
                                                num_kv_blocks=64, max_num_batched_tokens=16,
                                                max_num_seqs=4, dtype="float32", device=DEVICE))
        params = engine.SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
        return [o.token_ids for o in eng.generate(ids, params)]

    expected = tokens("torch")
    assert tokens("triton") == expected


def test_lora_kernel_in_the_engine_matches_torch(tiny_model, tmp_path):
    """Adapters through kernels/triton_lora.py (each token's slot from the step layout)
    give the torch path's tokens, in a batch mixing the base model and two adapters."""
    from tests.lora_adapters import write_peft_adapter

    a = write_peft_adapter(tmp_path / "a", tiny_model, r=4, target_modules=["q_proj", "v_proj"], seed=1)
    b = write_peft_adapter(tmp_path / "b", tiny_model, r=2, target_modules=["o_proj", "down_proj", "up_proj"],
                           seed=2)

    def tokens(kernels):
        eng = engine.Engine(engine.EngineConfig(model=tiny_model, kernels=kernels, block_size=4,
                                                num_kv_blocks=64, max_num_batched_tokens=64, device=DEVICE,
                                                max_loras=2, max_lora_rank=4))
        eng.add_lora("a", a)
        eng.add_lora("b", b)
        params = engine.SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
        for i, (p, lora) in enumerate(zip(PROMPTS[1:], [None, "a", "b"])):
            eng.add_request(f"r{i}", prompt=p, params=params, lora=lora)
        outs = {}
        while eng.has_unfinished():
            outs.update({o.request_id: o.token_ids for o in eng.step() if o.finished})
        return outs

    expected = tokens("torch")
    assert tokens("triton") == expected
