"""`KernelOps`: the five functions one backend gives the engine (its own module so that
kernels/ops.py, which picks a backend, and each backend's module both import it without
importing each other)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class KernelOps:
    name: str
    paged_attention: Callable
    write_kv: Callable
    rms_norm: Callable
    rotary: Callable
    silu_and_mul: Callable
