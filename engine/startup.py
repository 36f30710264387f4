"""The engine's device side, built in this order (inside its DeviceScope, engine/device.py):

    kernels, weights (+ a draft model's)  ->  model runner (its buffers)  ->  KV cache size
      ->  KV cache  ->  CUDA graphs

A speculative draft model (engine/spec/draft.py) has its own KV cache over the same blocks:
a block costs the target's bytes plus the draft's, and the budget is split accordingly.

The size is given (`num_kv_blocks`, `kv_cache_bytes`; 1 GiB on CPU when neither is) or, on
CUDA, measured: a profiling step at the largest batch on a throw-away cache
(engine/profile_run.py), then the arithmetic of engine/kv_sizing.py, logged. The graphs
come last: a graph holds the addresses it was captured with, the final KV cache's.
"""

from __future__ import annotations

import logging
import pathlib
from dataclasses import dataclass

import torch

from inflight.engine.config import EngineConfig
from inflight.engine.device import DeviceScope
from inflight.engine.errors import ConfigError
from inflight.engine.kv_sizing import CudaMemoryProbe, KVCachePlan, MemoryProbe, MemorySnapshot, plan_kv_cache
from inflight.engine.lora.slots import LoraSlots
from inflight.engine.model import DecoderModel
from inflight.engine.model_runner import ModelRunner
from inflight.engine.parallel import TensorParallelGroup, load_model
from inflight.engine.profile_run import profile_lengths, profile_memory
from inflight.engine.spec.draft import load_draft_model
from inflight.kernels.ops import KernelOps, get_ops

log = logging.getLogger(__name__)


@dataclass
class DeviceSide:
    ops: KernelOps
    model: DecoderModel
    runner: ModelRunner
    num_kv_blocks: int
    cuda_graphs: bool            # decode steps padded on static buffers
    kv_plan: KVCachePlan | None  # the figures a measured KV cache was sized from
    parallel: TensorParallelGroup | None = None  # the tensor-parallel group the model runs on


def build_device_side(config: EngineConfig, folder: pathlib.Path, scope: DeviceScope,
                      probe: MemoryProbe | None = None,
                      parallel_group: TensorParallelGroup | None = None) -> DeviceSide:
    """`probe`: measures memory for a KV cache of no given size (default on CUDA: torch's
    allocator; tests pass a fake one on CPU). `parallel_group`: a running tensor-parallel
    group to load the model onto (default: one is started when the config asks for it)."""
    device = scope.device
    if device.type == "cuda":
        log.info("engine on %s (%s)", device, torch.cuda.get_device_name(device))
    ops = get_ops(config.kernels, config.device)
    if config.num_kv_blocks is not None or config.kv_cache_bytes is not None:
        probe = None
    elif probe is None and device.type == "cuda":
        probe = CudaMemoryProbe(device)
    start = probe.snapshot() if probe is not None else None
    model, parallel = load_model(config, folder, ops, device, parallel_group)
    try:
        return _after_weights(config, scope, probe, ops, model, parallel, start)
    except BaseException:
        if parallel is not None:
            parallel.release()
        raise


def _after_weights(config: EngineConfig, scope: DeviceScope, probe: MemoryProbe | None,
                   ops: KernelOps, model: DecoderModel, parallel: TensorParallelGroup | None,
                   start: MemorySnapshot | None) -> DeviceSide:
    device = scope.device
    draft = None
    spec = config.speculative_config
    if spec is not None and spec.method == "draft_model":
        draft = load_draft_model(spec, config.model, model,
                                 lambda path: DecoderModel(path, ops, config.torch_dtype, device,
                                                         model.max_model_len, config.kv_torch_dtype))
    if config.max_loras:
        # the adapters' slot tensors are preallocated here, before the memory after the weights
        # is measured: a KV cache sized on CUDA leaves room for them
        model.lora = LoraSlots(model.config, config.max_loras, config.max_lora_rank, config.torch_dtype,
                               device, kernel=ops.name == "triton")
    after_weights = probe.snapshot() if probe is not None else None
    cuda_graphs = config.resolve_cuda_graphs(ops.name)
    capture = cuda_graphs and device.type == "cuda"
    if capture and config.tensor_parallel_size > 1:
        log.warning("CUDA graphs are not captured across tensor-parallel ranks; running "
                    "decode steps padded but uncaptured")
        capture = False
    if capture and ops.name != "triton":
        log.warning("CUDA graphs need the Triton kernels (the torch path syncs with the "
                    "host); running decode steps padded but uncaptured")
        capture = False
    runner = ModelRunner(model, config.block_size, config.seed, max_num_seqs=config.max_num_seqs,
                         max_num_batched_tokens=config.max_num_batched_tokens,
                         cuda_graphs=cuda_graphs, poison=config.debug_checks, stream=scope.stream,
                         draft=draft)
    plan = None
    if probe is not None:
        plan = measured_plan(config, model, runner, probe, start, after_weights, capture)
        num_blocks = plan.num_blocks
    else:
        num_blocks = given_num_blocks(config, model, draft)
    runner.allocate_kv_cache(num_blocks)
    log.info("KV cache in %s (kv_cache_dtype=%s): %d blocks of %d tokens, %d bytes per block",
             str(model.kv_dtype).removeprefix("torch."), config.kv_cache_dtype, num_blocks,
             config.block_size, kv_bytes_per_block(model, draft, config.block_size))
    if capture:
        before = probe.snapshot() if probe is not None else None
        runner.capture_graphs()
        if probe is not None:
            log_graph_memory(probe, before, plan.graphs)
    scope.synchronize()
    return DeviceSide(ops, model, runner, num_blocks, cuda_graphs, plan, parallel)


def kv_bytes_per_block(model: DecoderModel, draft: DecoderModel | None, block_size: int) -> int:
    return model.kv_bytes_per_block(block_size) + (draft.kv_bytes_per_block(block_size) if draft else 0)


def given_num_blocks(config: EngineConfig, model: DecoderModel, draft: DecoderModel | None = None) -> int:
    per_block = kv_bytes_per_block(model, draft, config.block_size)
    if config.num_kv_blocks:
        return config.num_kv_blocks
    budget = config.kv_cache_bytes if config.kv_cache_bytes is not None else 1 << 30
    blocks = budget // per_block
    if blocks < 1:
        raise ConfigError(f"EngineConfig.kv_cache_bytes={budget} is less than one KV block "
                          f"({per_block} bytes at block_size={config.block_size}); "
                          "raise kv_cache_bytes or set num_kv_blocks")
    return blocks


def measured_plan(config: EngineConfig, model: DecoderModel, runner: ModelRunner, probe: MemoryProbe,
                  start: MemorySnapshot, after_weights: MemorySnapshot, capture: bool) -> KVCachePlan:
    """Profile the largest step on a throw-away KV cache, then size the real one."""
    before = probe.snapshot()
    lengths = profile_lengths(config.max_num_batched_tokens, config.max_num_seqs, model.max_model_len)
    activations, graphs = profile_memory(runner, probe, lengths, capture)
    plan = plan_kv_cache(start, after_weights, before, probe.snapshot(), activations=activations,
                         graphs=graphs, fraction=config.kv_cache_memory_fraction,
                         bytes_per_block=kv_bytes_per_block(model, runner.draft, config.block_size),
                         block_size=config.block_size)
    if plan.num_blocks < 1:
        raise ConfigError(plan.shortfall())
    log.info("%s; profiled: %d tokens in %d requests, all sampled with logprobs, prompt "
             "logprobs on every prompt row", plan.describe(), sum(lengths), len(lengths))
    tokens = plan.num_blocks * config.block_size
    if tokens < model.max_model_len:
        log.warning("the KV cache holds %d tokens, less than max_model_len=%d: longer requests "
                    "are refused (lower max_model_len or raise kv_cache_memory_fraction)",
                    tokens, model.max_model_len)
    return plan


def log_graph_memory(probe: MemoryProbe, before: MemorySnapshot, kept: int) -> None:
    probe.release()  # the warm-up runs' cached blocks are not the graphs' pool
    took = max(0, probe.snapshot().used - before.used)
    if took > kept:
        log.warning("CUDA graphs took %.2f GiB, more than the %.2f GiB kept for them: lower "
                    "kv_cache_memory_fraction if steps run out of memory", took / 2**30, kept / 2**30)
    else:
        log.info("CUDA graphs took %.2f GiB (%.2f GiB kept for them)", took / 2**30, kept / 2**30)
