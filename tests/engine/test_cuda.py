"""The GPU step on a real GPU: CUDA graphs captured and replayed, overlapped output
processing, pinned asynchronous copies, no host sync (nor pageable copy) while a step is
launched, sampling on the device with seeds, a worker's engine on an explicit device
(cuda:0 through the cuda:N path, cuda:1 where there is one, cuda:auto) stepped on its own
thread, events on the engine's own stream, and the KV cache sized after a profiling step.
Skipped without CUDA (benchmarks/gpu/run_all.sh runs these on a lent GPU)."""

from __future__ import annotations

import gc
import logging
import queue
import random
import time

import pytest
import torch

from inflight.engine import Engine, EngineConfig, SamplingParams
from tests.engine.test_decode_paths import N, drive
from tests.tiny_llama import write_tiny_llama

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
    assert eng.device == torch.device("cuda", torch.cuda.current_device())  # "cuda" made explicit
    assert eng.runner.stream is eng.scope.stream != torch.cuda.default_stream(eng.device)
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
    # logprobs and prompt logprobs: their row indices travel in the staged copy (a tensor
    # built from a list here would be a synchronous pageable copy, an error in this mode)
    lp = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, logprobs=5, prompt_logprobs=3)
    out = eng.generate([prompts[5]], lp)[0]
    assert len(out.logprobs) == 4 and len(out.prompt_logprobs) == len(prompts[5])


def test_seeded_sampling_on_device_reproducible(tiny_model_path, prompts):
    eng = make(tiny_model_path, num_kv_blocks=128)
    seeded = SamplingParams(max_tokens=10, temperature=1.0, top_k=40, seed=1234, ignore_eos=True)
    alone = eng.generate([prompts[0]], seeded)[0].token_ids
    others = [SamplingParams(max_tokens=9, temperature=0.8, top_p=0.9, ignore_eos=True),
              SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)]
    mixed = eng.generate([prompts[3], prompts[0], prompts[5]], [others[0], seeded, others[1]])
    assert mixed[1].token_ids == alone


def worker_devices() -> list[str]:
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return ["cuda:0", "cuda:auto"] + [f"cuda:{i}" for i in range(1, min(n, 2))]


@pytest.mark.parametrize("device", worker_devices())
def test_worker_engine_on_an_explicit_device(tiny_model_path, prompts, hf_ref, tmp_path, device):
    """The worker's path (build_engine with --device, the engine loop's own thread): the
    weights, the KV cache, the graphs and every launch on that device, nothing on another
    one, greedy tokens equal HF's. cuda:0 goes through the same code as cuda:1."""
    from inflight.consumers.engine_bridge import build_engine
    from inflight.consumers.engine_loop import EngineLoop
    from inflight.consumers.thread_messages import Slots, StepOutputs
    from inflight.schemas import Settings

    gc.collect()
    count = torch.cuda.device_count()
    before = {i: torch.cuda.memory_allocated(i) for i in range(count)}
    settings = Settings(gpu_lock_dir=tmp_path, max_num_seqs=4, block_size=4, device=device,
                        model_path=str(tiny_model_path), kv_cache_bytes=16 << 20, dtype="float32")
    eng = build_engine(settings)
    index = 0 if device == "cuda:auto" else int(device.split(":")[1])
    try:
        assert eng.device == torch.device("cuda", index) and eng.scope.stream.device == eng.device
        assert all(t.device == eng.device for kv in eng.runner.kv_caches for t in kv)
        assert eng.runner.graphs.graphs  # captured on that device
        publish: queue.Queue = queue.Queue()
        loop = EngineLoop(eng, publish, Slots(1 << 20)).start()
        greedy = SamplingParams(max_tokens=N, temperature=0.0, ignore_eos=True)
        for i, p in enumerate(prompts[:4]):
            loop.add(f"r{i}", prompt_token_ids=p, params=greedy)
        finals = {}
        deadline = time.monotonic() + 120
        while len(finals) < 4 and time.monotonic() < deadline:
            msg = publish.get(timeout=60)
            if isinstance(msg, StepOutputs):
                finals.update({o.request_id: o for o in msg.outputs if o.finished})
        loop.stop()
        assert loop.join(30) and loop.error is None
        for i, p in enumerate(prompts[:4]):
            assert finals[f"r{i}"].token_ids == hf_ref.greedy(tiny_model_path, p, N), i
        # this thread's current device is cuda:0 whatever the engine's: the scope moves it
        out = eng.generate([prompts[5]], greedy)[0]
        assert out.token_ids == hf_ref.greedy(tiny_model_path, prompts[5], N)
        for i in range(count):
            if i != index:
                assert torch.cuda.memory_allocated(i) == before[i], f"allocations on cuda:{i}"
    finally:
        if eng.device_claim is not None:
            eng.device_claim.close()


def test_events_are_recorded_on_the_engine_stream(tiny_model_path, prompts, monkeypatch):
    """The calling thread's current stream is busy for seconds: the engine neither queues
    its work there nor waits on it (its events are on its own stream), so a generate ends
    while that stream is still busy. Recorded on the caller's stream, every wait for the
    sampled ids and the staging buffers would wait out the sleep."""
    eng = make(tiny_model_path, num_kv_blocks=128)
    greedy = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    eng.generate(prompts[:2], greedy)  # compiled and warm
    streams = []
    device_step = eng.runner.device_step

    def spy(*a, **kw):
        streams.append(torch.cuda.current_stream(eng.device))
        return device_step(*a, **kw)

    eng.runner.device_step = spy
    recorded = []
    record = torch.cuda.Event.record

    def record_spy(event, stream=None):
        recorded.append(stream if stream is not None else torch.cuda.current_stream())
        return record(event, stream)

    monkeypatch.setattr(torch.cuda.Event, "record", record_spy)
    side = torch.cuda.Stream(eng.device)
    with torch.cuda.stream(side):
        torch.cuda._sleep(int(4e9))  # a few seconds of spinning on `side`
        outs = eng.generate(prompts[2:4], greedy)
        side_still_busy = not side.query()
    side.synchronize()
    assert side_still_busy
    assert streams and all(s == eng.scope.stream for s in streams)
    assert recorded and all(s == eng.scope.stream for s in recorded)  # staging and sampled ids
    assert [len(o.token_ids) for o in outs] == [4, 4]


def test_kv_cache_sized_after_profiling(tmp_path_factory, caplog):
    """No KV size given: the engine profiles the largest step (2,048 prefill tokens with
    prompt logprobs, 64 rows sampled with top-k/top-p over a 32k vocabulary and logprobs),
    logs the figures, and sizes the cache so that the real largest steps stay within
    kv_cache_memory_fraction of the device: a long prompt with prompt logprobs and a full
    batch run without running out of memory, and the peak stays under the limit."""
    path = write_tiny_llama(tmp_path_factory.mktemp("wide-vocab"), vocab_size=32000, hidden_size=256,
                            num_heads=4, num_kv_heads=2, max_position_embeddings=4096)
    gc.collect()
    torch.cuda.empty_cache()
    dev = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.reset_peak_memory_stats(dev)
    base = torch.cuda.memory_allocated(dev)
    with caplog.at_level(logging.INFO, logger="inflight.engine.startup"):
        eng = Engine(EngineConfig(model=path, device="cuda", kv_cache_memory_fraction=0.3,
                                  max_num_seqs=64, max_num_batched_tokens=2048))
    plan = eng.kv_plan
    assert plan is not None and eng.num_kv_blocks == plan.num_blocks == eng.kv.num_blocks
    assert plan.weights > 0 and plan.activations > 0 and plan.graphs > 0
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("KV cache: ")]
    assert lines and f"{plan.num_blocks} blocks" in lines[0] and "peak activations" in lines[0]
    assert "profiled: 2048 tokens in 64 requests" in lines[0]
    assert any("CUDA graphs took" in r.getMessage() for r in caplog.records)
    rng = random.Random(0)
    long_prompt = [rng.randrange(5, 300) for _ in range(3000)]
    many = [[rng.randrange(5, 300) for _ in range(rng.randint(20, 200))] for _ in range(63)]
    scored = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=20, prompt_logprobs=20)
    sampled = SamplingParams(max_tokens=16, temperature=0.9, top_k=50, top_p=0.9, logprobs=5, ignore_eos=True)
    outs = eng.generate([long_prompt] + many, [scored] + [sampled] * 63)
    assert [o.finish_reason for o in outs] == ["length"] * 64
    assert len(outs[0].prompt_logprobs) == 3000
    peak = torch.cuda.max_memory_allocated(dev) - base
    assert peak <= plan.limit, (peak, plan.describe())
