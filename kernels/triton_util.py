"""Small helpers shared by the Triton wrappers (no kernels here)."""

from __future__ import annotations

import functools
import os

import torch


def is_cuda(t: torch.Tensor) -> bool:
    return t.device.type == "cuda"


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def check_device(*tensors: torch.Tensor) -> None:
    """All tensors on one device; CPU tensors only under the Triton interpreter."""
    device = tensors[0].device
    for t in tensors:
        if t.device != device:
            raise ValueError(f"tensors on different devices: {t.device} and {device}")
    if device.type == "cpu" and not interpreting():
        raise RuntimeError("Triton kernels on CPU tensors need the interpreter: set "
                           "TRITON_INTERPRET=1 before importing kernels.triton_ops, or use "
                           "INFLIGHT_KERNELS=torch")


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def num_sms() -> int:
    """Streaming multiprocessors of the current GPU (132 for an H100/H200 when none)."""
    if torch.cuda.is_available():
        return _sm_count(torch.cuda.current_device())
    return 132
