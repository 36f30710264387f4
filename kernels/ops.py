"""The kernel set the engine calls, chosen once per engine: "torch" or "triton".

The engine holds one `KernelOps` and calls its five functions; it never imports a kernel
module directly. Default: triton on CUDA, torch elsewhere; `EngineConfig.kernels` overrides
(a worker's INFLIGHT_KERNELS sets it; triton on CPU needs TRITON_INTERPRET=1).
"""

from __future__ import annotations

from inflight.kernels.activation import silu_and_mul_ref
from inflight.kernels.attention import paged_attention_torch
from inflight.kernels.kernel_set import KernelOps
from inflight.kernels.kv_write import write_kv_ref
from inflight.kernels.rmsnorm import rms_norm_ref
from inflight.kernels.rotary import rotary_ref

__all__ = ["BACKENDS", "KernelOps", "TORCH_OPS", "get_ops", "resolve_backend"]

BACKENDS = ("torch", "triton")

TORCH_OPS = KernelOps("torch", paged_attention_torch, write_kv_ref, rms_norm_ref, rotary_ref,
                      silu_and_mul_ref)


def resolve_backend(requested: str | None, device: str) -> str:
    name = requested or ("triton" if str(device).startswith("cuda") else "torch")
    if name not in BACKENDS:
        raise ValueError(f"unknown kernel backend {name!r}: set EngineConfig.kernels "
                         f"(INFLIGHT_KERNELS) to one of {BACKENDS}")
    return name


def get_ops(requested: str | None = None, device: str = "cpu") -> KernelOps:
    name = resolve_backend(requested, device)
    if name == "torch":
        return TORCH_OPS
    from inflight.kernels.triton_ops import TRITON_OPS  # imported only when asked for: needs triton

    return TRITON_OPS
