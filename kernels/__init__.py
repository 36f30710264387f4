"""Triton kernels, each beside its plain-torch reference. Imports nothing of the project."""

from inflight.kernels.ops import KernelOps, get_ops, resolve_backend

__all__ = ["KernelOps", "get_ops", "resolve_backend"]
