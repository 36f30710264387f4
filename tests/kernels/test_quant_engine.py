"""A quantized tiny Llama in the engine with the Triton kernels (interpreter on CPU) gives
the torch path's greedy tokens (fp32; chunked prefill, prefix cache). w4 only: the
interpreter is slow, and the W8A16 kernel behind the engine's W8Linear is checked at the
layer level (test_quant_matmul.py)."""

import pytest

from inflight.engine import Engine, EngineConfig, SamplingParams
from tests.quant_models import quantized
from tests.tiny_llama import write_tiny_llama

PROMPTS = ["the quick brown fox jumps over the lazy dog and the quick brown fox",
           "the quick brown fox jumps over the lazy dog and then"]  # a shared prefix


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("tiny") / "llama", num_layers=2, hidden_size=64,
                            num_heads=4, num_kv_heads=2)


def test_triton_quantized_engine_matches_torch(tiny, tmp_path):
    q = quantized(tiny, tmp_path / "q", "w4", 32)
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    tokens = {}
    for kernels in ("torch", "triton"):
        eng = Engine(EngineConfig(model=q, kernels=kernels, block_size=4, num_kv_blocks=64,
                                  max_num_batched_tokens=16, dtype="float32"))
        tokens[kernels] = [o.token_ids for o in eng.generate(PROMPTS, params)]
        assert eng.stats()["prefix_cache_hit_tokens"] > 0
    assert tokens["triton"] == tokens["torch"]
