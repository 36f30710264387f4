"""Speculative decoding on a real GPU: Triton kernels, CUDA graphs captured (the draft
model's mirror forward inside them), overlapped outputs for the steps that do not
speculate; greedy tokens are Hugging Face's for every method, seeded sampling repeats.
Skipped without CUDA (benchmarks/gpu/run_all.sh runs it on a lent GPU)."""

from __future__ import annotations

import pytest
import torch

from inflight.engine import SamplingParams
from tests.engine.spec.conftest import GREEDY, N, make, methods, spec_prompts

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("method", ["ngram", "draft", "self-draft", "suffix"])
def test_greedy_on_cuda_with_graphs_and_overlap(tiny_model_path, draft_model_path, hf_ref, method):
    spec = {**methods(tiny_model_path, draft_model_path)[method], "disable_by_batch_size": 3}
    prompts = spec_prompts()
    eng = make(tiny_model_path, spec, device="cuda", num_kv_blocks=64, block_size=4,
               max_num_batched_tokens=32, max_num_seqs=6)
    assert eng.ops.name == "triton" and eng.cuda_graphs and eng.overlap
    outs = eng.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == [hf_ref.greedy(tiny_model_path, p, N) for p in prompts]
    s = eng.stats()
    assert s["spec_decode_num_drafts"] > 0 and eng.runner.graphs.num_replays > 0
    assert s["kv_blocks_used"] == 0


def test_seeded_sampling_on_cuda_repeats(tiny_model_path, draft_model_path):
    spec = methods(tiny_model_path, draft_model_path)["draft"]
    params = [SamplingParams(max_tokens=16, temperature=0.8, top_k=40, seed=3 + i, ignore_eos=True)
              for i in range(3)]
    runs = [make(tiny_model_path, spec, device="cuda").generate(spec_prompts(3), params) for _ in range(2)]
    assert [o.token_ids for o in runs[0]] == [o.token_ids for o in runs[1]]
