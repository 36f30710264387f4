"""The GPU step on a real GPU: CUDA graphs captured and replayed, overlapped output
processing, pinned asynchronous copies, no host sync while a step is launched, sampling on
the device with seeds, and the KV cache sized from free memory. Skipped without CUDA
(benchmarks/gpu/run_all.sh runs these on a lent GPU)."""

from __future__ import annotations

import logging

import pytest
import torch

from inflight.engine import Engine, EngineConfig, SamplingParams
from tests.engine.test_decode_paths import N, drive

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def make(path, **kw):
    cfg = dict(device="cuda", dtype="float32", num_kv_blocks=24, block_size=4,
               max_num_batched_tokens=24, max_num_seqs=6, debug_checks=True)
    cfg.update(kw)
    return Engine(EngineConfig(model=path, **cfg))


def greedy_work(prompts):
    return [(f"r{i}", p, SamplingParams(max_tokens=N, temperature=0.0, ignore_eos=True))
            for i, p in enumerate(prompts)]


def test_defaults_on_cuda(tiny_model_path):
    eng = make(tiny_model_path)
    assert eng.ops.name == "triton" and eng.cuda_graphs and eng.overlap
    g = eng.runner.graphs
    assert sorted(g.graphs) == g.sizes == [1, 2, 4, 6]  # captured at start-up
    assert eng.runner.staging._hosts[0].is_pinned() and eng.runner._outs[0].is_pinned()


@pytest.mark.parametrize("graphs", [True, False])
def test_greedy_fp32_graphs_on_off_match_hf(tiny_model_path, prompts, hf_ref, graphs):
    """Mixed prefill/decode steps, chunked prefill and preemption (24 blocks of 4 tokens
    for 6 running requests), output processing overlapped; tokens equal HF's."""
    eng = make(tiny_model_path, cuda_graphs=graphs)
    _, finals = drive(eng, greedy_work(prompts), {"r4": 3})
    assert eng.stats()["preemptions"] > 0
    for rid, prompt, _ in greedy_work(prompts):
        out = finals[rid]
        if rid == "r4":
            assert out.finish_reason == "abort" and len(out.token_ids) == 3
        else:
            assert out.token_ids == hf_ref.greedy(tiny_model_path, prompt, N), rid
    if graphs:
        assert eng.runner.graphs.num_replays > 0 and eng.runner.graphs.num_eager == 0
    assert eng.runner.num_device_fed > 0


def test_no_host_sync_while_launching(tiny_model_path, prompts):
    """Launching a step (inputs, one copy, forward or graph replay, sampling, the copy of
    the sampled ids) never waits for the device."""
    eng = make(tiny_model_path, num_kv_blocks=128)
    launch = eng.runner.launch
    launched = []

    def checked(*a, **kw):
        torch.cuda.set_sync_debug_mode("error")
        try:
            launched.append(launch(*a, **kw))
        finally:
            torch.cuda.set_sync_debug_mode("default")
        return launched[-1]

    eng.runner.launch = checked
    outs = eng.generate(prompts[:4], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    assert all(len(o.token_ids) == 6 for o in outs) and len(launched) >= 6
    seeded = SamplingParams(max_tokens=4, temperature=0.8, top_p=0.9, top_k=20, seed=3, ignore_eos=True)
    assert len(eng.generate(prompts[:2], seeded)[0].token_ids) == 4


def test_seeded_sampling_on_device_reproducible(tiny_model_path, prompts):
    eng = make(tiny_model_path, num_kv_blocks=128)
    seeded = SamplingParams(max_tokens=10, temperature=1.0, top_k=40, seed=1234, ignore_eos=True)
    alone = eng.generate([prompts[0]], seeded)[0].token_ids
    others = [SamplingParams(max_tokens=9, temperature=0.8, top_p=0.9, ignore_eos=True),
              SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)]
    mixed = eng.generate([prompts[3], prompts[0], prompts[5]], [others[0], seeded, others[1]])
    assert mixed[1].token_ids == alone


def test_kv_cache_sized_from_free_memory(tiny_model_path, caplog):
    with caplog.at_level(logging.INFO, logger="inflight.engine.engine"):
        eng = Engine(EngineConfig(model=tiny_model_path, device="cuda", kv_cache_memory_fraction=0.02,
                                  max_num_seqs=4, cuda_graphs=False))
    free, _ = torch.cuda.mem_get_info()
    per_block = eng.model.kv_bytes_per_block(eng.block_size)
    assert 0 < eng.num_kv_blocks * per_block <= 0.03 * (free + eng.num_kv_blocks * per_block)
    assert any("KV cache" in r.getMessage() for r in caplog.records)
    assert eng.generate([[5, 6, 7]], SamplingParams(max_tokens=3, temperature=0.0))[0].token_ids
