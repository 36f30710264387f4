"""Engine configuration: one frozen dataclass, checked once, passed explicitly."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from inflight.engine.errors import ConfigError
from inflight.engine.fair_share import parse_weights
from inflight.engine.spec.config import SpeculativeConfig
from inflight.kernels.kv_quant import KV_CACHE_DTYPES

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


@dataclass(frozen=True)
class EngineConfig:
    """How to build one engine.

    - `model`: a Hugging Face folder (config.json, *.safetensors, tokenizer.json).
    - `block_size`: tokens per KV block.
    - `kv_cache_bytes` / `num_kv_blocks`: the KV budget; `num_kv_blocks` wins when set.
      Neither set: on CUDA, sized after a profiling step at the largest batch so that
      weights, activations, CUDA graphs and the KV cache fit in `kv_cache_memory_fraction`
      of the device's memory (engine/kv_sizing.py; the figures are logged); elsewhere 1 GiB.
    - `max_num_seqs`: most requests running at once; `max_num_batched_tokens`: tokens per
      forward pass (the step budget; longer prompts are prefilled in chunks).
    - `max_model_len`: context cap (default: the checkpoint's context, max_position_embeddings;
      YaRN configs: original length x factor when longer).
    - `max_preemptions`: a request preempted more often than this fails with an error.
    - `kernels`: "torch" | "triton" | None (see kernels.ops.resolve_backend).
    - `debug_checks`: verify block-pool invariants after every step and poison freed
      input-batch rows (tests turn it on).
    - `cuda_graphs`: run decode-only steps padded on static buffers, captured as CUDA
      graphs (None: on for CUDA with the Triton kernels; False: off). True on CPU runs the
      same padded path eagerly (tests).
    - `overlap_outputs`: process a step's outputs (detokenize, stop checks) while the
      next step runs on the device, one step ahead (None: on for CUDA). Steps that
      speculate run synchronously (their drafts need the step before's tokens).
    - `tensor_parallel_size`: ranks the model is sharded over (Megatron-style, engine/parallel):
      this process is rank 0 and starts the others; on CUDA rank r runs on cuda:(i + r)
      for `device` cuda:i. The KV budget (`kv_cache_bytes`) is per rank.
    - `distributed_executor_backend`: "uni" (one process, no tensor-parallel code; the
      default at size 1) or "mp" (rank processes; the default above 1; at size 1 it runs
      the tensor-parallel code path with no other rank: benchmarks/tensor_parallel.py).
    - `kv_cache_dtype`: what the KV cache stores: "auto" (the model dtype), "int8" or "fp8"
      (e4m3; "fp8_e4m3" is the same), each 8-bit key and value row with its own fp16 scale
      per token and KV head, computed as it is written (kernels/kv_quant.py). The blocks of
      a byte budget grow by (D x dtype bytes) / (D + 2): head dim 64 gives 1.94x against
      fp16/bf16 and 3.88x against fp32.
    - `speculative_config`: speculative decoding with vLLM's keys, as a dict, its JSON
      text or a SpeculativeConfig (engine/spec/config.py), e.g. {"method": "ngram",
      "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4};
      None = off. Stored as a SpeculativeConfig.
    - `cache_dir`: where start-up measurements are kept between runs: the verification
      costs of speculative decoding, measured on the device at the first start
      (engine/spec/verify_costs.py); None: nothing is measured, the documented curve of
      the device type is read instead. The service passes INFLIGHT_CACHE_DIR.
    """

    model: str | os.PathLike
    block_size: int = 16
    kv_cache_bytes: int | None = None
    kv_cache_memory_fraction: float = 0.9
    num_kv_blocks: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    dtype: str = "float32"
    device: str = "cpu"
    seed: int = 0
    kernels: str | None = None
    max_preemptions: int = 16
    debug_checks: bool = False
    cuda_graphs: bool | None = None
    overlap_outputs: bool | None = None
    tensor_parallel_size: int = 1
    distributed_executor_backend: str | None = None
    speculative_config: SpeculativeConfig | dict | str | None = None
    kv_cache_dtype: str = "auto"
    cache_dir: str | os.PathLike | None = None
    max_loras: int = 0
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None
    fair_share: bool = True
    tenant_weights: tuple | dict | str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "tenant_weights", parse_weights(self.tenant_weights))
        if self.speculative_config is not None:
            object.__setattr__(self, "speculative_config",
                               SpeculativeConfig.from_value(self.speculative_config))
        if self.dtype not in DTYPES:
            raise ConfigError(f"EngineConfig.dtype={self.dtype!r} is not supported; "
                              f"use one of {sorted(DTYPES)}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(f"EngineConfig.kv_cache_dtype={self.kv_cache_dtype!r} is not supported; "
                              f"use one of {list(KV_CACHE_DTYPES)} (INFLIGHT_KV_CACHE_DTYPE, "
                              "inflight worker --kv-cache-dtype)")
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"EngineConfig.{name}={getattr(self, name)} must be >= 1")
        if self.kv_cache_bytes is not None and self.kv_cache_bytes < 1:
            raise ConfigError(f"EngineConfig.kv_cache_bytes={self.kv_cache_bytes} must be >= 1 "
                              "(or None to size the cache after a profiling step on CUDA, 1 GiB on CPU)")
        if not 0.0 < self.kv_cache_memory_fraction <= 1.0:
            raise ConfigError(f"EngineConfig.kv_cache_memory_fraction={self.kv_cache_memory_fraction} "
                              "must be in (0, 1]")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ConfigError(f"EngineConfig.num_kv_blocks={self.num_kv_blocks} must be >= 1 "
                              "(or None to size the cache from kv_cache_bytes)")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ConfigError(f"EngineConfig.max_model_len={self.max_model_len} must be >= 2")
        if self.max_preemptions < 0:
            raise ConfigError(f"EngineConfig.max_preemptions={self.max_preemptions} must be >= 0")
        if self.tensor_parallel_size < 1:
            raise ConfigError(f"EngineConfig.tensor_parallel_size={self.tensor_parallel_size} must be >= 1")
        if self.speculative_config is not None and self.tensor_parallel_size > 1:
            raise ConfigError(f"speculative_config with tensor_parallel_size={self.tensor_parallel_size} "
                              "is not supported yet (the follower ranks run plain steps only): "
                              "drop one of them")
        self._check_lora()
        if self.distributed_executor_backend not in (None, "uni", "mp"):
            raise ConfigError(f"EngineConfig.distributed_executor_backend="
                              f"{self.distributed_executor_backend!r}: use 'uni' or 'mp' (or None)")
        if self.distributed_executor_backend == "uni" and self.tensor_parallel_size > 1:
            raise ConfigError(f"EngineConfig.tensor_parallel_size={self.tensor_parallel_size} needs "
                              "distributed_executor_backend 'mp' (or None), not 'uni' (one process)")

    def _check_lora(self) -> None:
        if self.max_loras < 0 or self.max_lora_rank < 1:
            raise ConfigError(f"EngineConfig.max_loras={self.max_loras} must be >= 0 and "
                              f"max_lora_rank={self.max_lora_rank} >= 1")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ConfigError(f"EngineConfig.max_cpu_loras={self.max_cpu_loras} must be >= "
                              f"max_loras={self.max_loras} (or None)")
        if not self.max_loras:
            return
        if self.tensor_parallel:
            raise ConfigError(f"LoRA adapters (max_loras={self.max_loras}) with tensor parallelism "
                              f"(tensor_parallel_size={self.tensor_parallel_size}) are not supported "
                              "yet (A and B are not sharded): serve adapters on one rank, or set max_loras=0")
        if self.speculative_config is not None:
            raise ConfigError(f"LoRA adapters (max_loras={self.max_loras}) with speculative decoding "
                              "are not supported yet (the draft and the verification would need the "
                              "request's adapter): drop speculative_config or set max_loras=0")

    @property
    def lora_cpu_capacity(self) -> int:
        return self.max_cpu_loras if self.max_cpu_loras is not None else self.max_loras

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def kv_torch_dtype(self) -> torch.dtype:
        """The KV cache's element type: the model dtype for "auto", else int8 / float8_e4m3fn."""
        return KV_CACHE_DTYPES[self.kv_cache_dtype] or self.torch_dtype

    @property
    def tensor_parallel(self) -> bool:
        """Whether the model runs sharded (engine/parallel), possibly over one rank."""
        return self.tensor_parallel_size > 1 or self.distributed_executor_backend == "mp"

    @property
    def is_cuda(self) -> bool:
        return str(self.device).startswith("cuda")

    def resolve_cuda_graphs(self, kernels: str) -> bool:
        """Whether decode steps run padded on static buffers (see `cuda_graphs`)."""
        if self.cuda_graphs is not None:
            return self.cuda_graphs
        # NOTE: not across ranks (yet): a captured graph would hold the collectives of one
        # rank, and the followers would have to replay theirs in step
        return self.is_cuda and kernels == "triton" and self.tensor_parallel_size == 1

    def resolve_overlap_outputs(self) -> bool:
        return self.is_cuda if self.overlap_outputs is None else self.overlap_outputs
