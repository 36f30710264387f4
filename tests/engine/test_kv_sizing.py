"""Sizing the KV cache after a profiling step (engine/kv_sizing.py, engine/profile_run.py):
the arithmetic on given figures, the shape of the profiling step, and the engine's start-up
order (weights, profile on a throw-away cache, size, allocate) with a fake memory probe on
CPU, which must leave the engine exactly as it would be without profiling."""

from __future__ import annotations

import logging

import pytest
import torch

from inflight.engine import Engine, EngineConfig, SamplingParams
from inflight.engine.errors import ConfigError
from inflight.engine.kv_sizing import KVCachePlan, MemorySnapshot, plan_kv_cache
from inflight.engine.profile_run import profile_batch, profile_lengths

GiB = 1 << 30
MiB = 1 << 20


def plan(**kw) -> KVCachePlan:
    figures = dict(total=80 * GiB, fraction=0.9, weights=16 * GiB, buffers=100 * MiB,
                   activations=2 * GiB, graphs=512 * MiB, non_torch=400 * MiB, free=63 * GiB,
                   bytes_per_block=2 * MiB, block_size=16)
    figures.update(kw)
    return KVCachePlan(**figures)


def test_kv_takes_what_the_limit_leaves():
    p = plan()
    non_kv = 16 * GiB + 100 * MiB + 2 * GiB + 512 * MiB + 400 * MiB
    assert p.limit == int(0.9 * 80 * GiB) and p.non_kv == non_kv
    assert p.kv_bytes == p.limit - non_kv and not p.capped_by_free
    assert p.num_blocks == (p.limit - non_kv) // (2 * MiB)
    # everything together stays within the limit, and the last block would not fit
    assert p.non_kv + p.num_blocks * p.bytes_per_block <= p.limit
    assert p.non_kv + (p.num_blocks + 1) * p.bytes_per_block > p.limit


def test_kv_never_takes_memory_that_is_not_free():
    """Another process holds 30 GiB: the free memory, not the limit, sets the size."""
    p = plan(free=33 * GiB)
    assert p.capped_by_free
    assert p.kv_bytes == 33 * GiB - 2 * GiB - 512 * MiB
    assert "capped by the 33.00 GiB free" in p.describe()


def test_describe_names_every_figure():
    line = plan().describe()
    for part in ("KV cache: ", " blocks of 16 tokens", "weights 16.00 GiB", "peak activations 2.00 GiB",
                 "CUDA graphs 0.50 GiB", "kv_cache_memory_fraction", "limit 0.9 x 80.00 GiB"):
        assert part in line, part


def test_no_room_is_a_config_error_that_says_what_to_change():
    p = plan(weights=75 * GiB)
    assert p.num_blocks == 0 and p.kv_bytes == 0
    msg = p.shortfall()
    assert "weights 75.00 GiB" in msg and "kv_cache_memory_fraction" in msg and "max_num_batched_tokens" in msg


def test_plan_from_snapshots():
    """weights / buffers from torch's allocated bytes; the growth of used memory that torch's
    reserved bytes do not explain is non-torch memory."""
    start = MemorySnapshot(free=79 * GiB, total=80 * GiB, allocated=0, reserved=0)
    after_weights = MemorySnapshot(free=63 * GiB, total=80 * GiB, allocated=16 * GiB, reserved=16 * GiB)
    before_profile = MemorySnapshot(free=62 * GiB, total=80 * GiB, allocated=16 * GiB + 100 * MiB,
                                    reserved=17 * GiB)
    after = MemorySnapshot(free=62 * GiB - 300 * MiB, total=80 * GiB, allocated=16 * GiB + 100 * MiB,
                           reserved=16 * GiB + 200 * MiB)
    p = plan_kv_cache(start, after_weights, before_profile, after, activations=2 * GiB, graphs=0,
                      fraction=0.5, bytes_per_block=MiB, block_size=16)
    assert (p.weights, p.buffers, p.activations) == (16 * GiB, 100 * MiB, 2 * GiB)
    # used grew 17 GiB + 300 MiB, torch's reserved 16 GiB + 200 MiB of it
    assert p.non_torch == GiB + 100 * MiB
    assert p.free == 62 * GiB - 300 * MiB and p.limit == 40 * GiB
    assert p.num_blocks == (40 * GiB - p.non_kv) // MiB


@pytest.mark.parametrize("tokens,seqs,max_len,want", [
    (2048, 64, 4096, [1985] + [1] * 63),            # one long prefill, every row sampled
    (100, 8, 20, [19, 19, 19, 19, 19, 3, 1, 1]),    # prompts stay below max_model_len
    (5, 64, 512, [1] * 5),                           # fewer tokens than sequences
    (10, 1, 4, [3]),                                 # what one sequence can hold
])
def test_profile_lengths(tokens, seqs, max_len, want):
    got = profile_lengths(tokens, seqs, max_len)
    assert got == want and max(got) <= max_len - 1


def test_profile_batch_asks_for_everything_a_step_can_do():
    sched, blocks = profile_batch([9, 1, 4], block_size=4)
    assert sched.num_tokens == [9, 1, 4] and blocks == 3 + 1 + 1
    assert [r.block_ids for r in sched.requests] == [[0, 1, 2], [3], [4]]
    p = sched.requests[0].params
    assert p.temperature > 0 and p.uses_top_k and p.uses_top_p
    assert p.logprobs == 20 and p.prompt_logprobs == 20


class FakeProbe:
    """Scripted snapshots, in the order the engine takes them: before the weights, after
    them, before profiling, at the profiling step's start, after profiling."""

    def __init__(self, snapshots, activations):
        self.snapshots = list(snapshots)
        self.activations = activations
        self.calls: list[str] = []
        self.base = None

    def snapshot(self):
        self.calls.append("snapshot")
        snap = self.snapshots.pop(0)
        self.base = snap.allocated
        return snap

    def reset_peak(self):
        self.calls.append("reset_peak")

    def peak_allocated(self):
        self.calls.append("peak")
        return self.base + self.activations

    def release(self):
        self.calls.append("release")


def fake_probe(per_block):
    total = 64 * per_block * 10
    snaps = [MemorySnapshot(total, total, 0, 0),
             MemorySnapshot(total - 100 * per_block, total, 100 * per_block, 100 * per_block),
             MemorySnapshot(total - 110 * per_block, total, 110 * per_block, 110 * per_block),
             MemorySnapshot(total - 120 * per_block, total, 120 * per_block, 120 * per_block),
             MemorySnapshot(total - 110 * per_block, total, 110 * per_block, 110 * per_block)]
    return FakeProbe(snaps, activations=30 * per_block), total


def test_engine_sizes_kv_after_profiling_and_is_unchanged_by_it(tiny_model_path, prompts, caplog):
    """With a memory probe (CUDA's by default, a fake one here) and no explicit KV size the
    engine profiles the largest step on a throw-away cache first, then sizes the real one:
    (0.5 x total - weights - buffers - activations) / block. The profiling leaves no trace:
    seeded and unseeded sampling give the tokens an engine without profiling gives."""
    kw = dict(block_size=4, max_num_seqs=6, max_num_batched_tokens=40, debug_checks=True)
    plain = Engine(EngineConfig(model=tiny_model_path, num_kv_blocks=200, **kw))
    per_block = plain.model.kv_bytes_per_block(4)
    probe, total = fake_probe(per_block)
    with caplog.at_level(logging.INFO, logger="inflight.engine.startup"):
        eng = Engine(EngineConfig(model=tiny_model_path, kv_cache_memory_fraction=0.5, **kw),
                     memory_probe=probe)
    assert probe.calls == ["snapshot", "snapshot", "snapshot", "reset_peak", "snapshot", "peak",
                           "release", "snapshot"]
    want = (total // 2 - 100 * per_block - 10 * per_block - 30 * per_block) // per_block
    assert eng.num_kv_blocks == want == eng.kv_plan.num_blocks == eng.kv.num_blocks
    assert eng.runner.kv_caches[0][0].shape[0] == want
    assert eng.kv_plan.weights == 100 * per_block and eng.kv_plan.activations == 30 * per_block
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("KV cache: "))
    assert f"{want} blocks of 4 tokens" in line and "peak activations" in line and "weights" in line
    assert "profiled: 40 tokens in 6 requests" in line
    # one profiling step, launched and read; no row, generator draw or diff left behind
    assert eng.runner._next_seq == 1 and not eng.runner._unread
    assert not eng.runner.batch.row_of and eng.runner.batch._free == plain.runner.batch._free
    params = [SamplingParams(max_tokens=6, temperature=0.9, top_k=30, ignore_eos=True),
              SamplingParams(max_tokens=6, temperature=0.8, seed=3, ignore_eos=True),
              SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, prompt_logprobs=1)]
    got = eng.generate(prompts[:3], params)
    ref = plain.generate(prompts[:3], params)
    assert [o.token_ids for o in got] == [o.token_ids for o in ref]


def test_explicit_sizes_skip_profiling(tiny_model_path):
    """num_kv_blocks / kv_cache_bytes given: no probe is asked (CPU behaviour unchanged)."""
    probe, _ = fake_probe(1)
    eng = Engine(EngineConfig(model=tiny_model_path, num_kv_blocks=7), memory_probe=probe)
    assert eng.num_kv_blocks == 7 and probe.calls == [] and eng.kv_plan is None
    eng = Engine(EngineConfig(model=tiny_model_path, kv_cache_bytes=1 << 20), memory_probe=probe)
    assert eng.num_kv_blocks == (1 << 20) // eng.model.kv_bytes_per_block(16) and probe.calls == []
    eng = Engine(EngineConfig(model=tiny_model_path))  # CPU, nothing given: 1 GiB, no probe
    assert eng.num_kv_blocks == (1 << 30) // eng.model.kv_bytes_per_block(16) and eng.kv_plan is None


def test_no_room_for_one_block_is_a_config_error(tiny_model_path):
    probe, total = fake_probe(Engine(EngineConfig(model=tiny_model_path, num_kv_blocks=1))
                              .model.kv_bytes_per_block(16))
    with pytest.raises(ConfigError, match="no room for the KV cache"):
        Engine(EngineConfig(model=tiny_model_path, kv_cache_memory_fraction=0.01), memory_probe=probe)


def test_padded_decode_profile_writes_no_kv(tiny_model_path):
    """The graph-pool measurement runs the padded decode body on padding rows only: it
    writes nothing into the (profiling) KV cache and counts no eager replay."""
    from inflight.engine.profile_run import run_padded_decode

    eng = Engine(EngineConfig(model=tiny_model_path, num_kv_blocks=8, block_size=4, max_num_seqs=6,
                              cuda_graphs=True))
    for k, v in eng.runner.kv_caches:
        k.fill_(1.5)
        v.fill_(-1.5)
    run_padded_decode(eng.runner)
    assert all(bool((k == 1.5).all()) and bool((v == -1.5).all()) for k, v in eng.runner.kv_caches)
    assert eng.runner.graphs.num_eager == 0


def test_cuda_probe_reads_the_allocator():
    from inflight.engine.kv_sizing import CudaMemoryProbe

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    snap = CudaMemoryProbe(torch.device("cuda", 0)).snapshot()
    assert 0 < snap.free <= snap.total and snap.allocated <= snap.reserved


def test_lora_slots_are_allocated_before_the_memory_after_the_weights_is_measured(tiny_model_path, monkeypatch):
    """The adapters' slot tensors (max_loras x max_lora_rank, every layer) are preallocated with
    the weights: the snapshot a measured KV cache subtracts as weights is taken after them, so
    the cache leaves room for the slots (it did not before stop 39)."""
    from inflight.engine.lora import slots as slots_mod

    kw = dict(block_size=4, max_num_seqs=6, max_num_batched_tokens=40)
    per_block = Engine(EngineConfig(model=tiny_model_path, num_kv_blocks=8, **kw)).model.kv_bytes_per_block(4)
    probe, _ = fake_probe(per_block)
    made = slots_mod.LoraSlots.__init__

    def init(self, *args, **kwargs):
        probe.calls.append("lora slots")
        made(self, *args, **kwargs)

    monkeypatch.setattr(slots_mod.LoraSlots, "__init__", init)
    eng = Engine(EngineConfig(model=tiny_model_path, kv_cache_memory_fraction=0.5, max_loras=2,
                              max_lora_rank=8, **kw), memory_probe=probe)
    assert probe.calls[:3] == ["snapshot", "lora slots", "snapshot"]
    assert eng.lora is not None and eng.model.lora is eng.lora.slots
