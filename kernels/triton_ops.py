"""The Triton kernel set (`get_ops("triton")`). Importing this module compiles nothing;
on CPU tensors the kernels run only under TRITON_INTERPRET=1 set before this import."""

from __future__ import annotations

from inflight.kernels.kernel_set import KernelOps
from inflight.kernels.triton_activation import silu_and_mul_triton
from inflight.kernels.triton_attention import paged_attention_triton
from inflight.kernels.triton_kv_write import write_kv_triton
from inflight.kernels.triton_rmsnorm import rms_norm_triton
from inflight.kernels.triton_rotary import rotary_triton

TRITON_OPS = KernelOps("triton", paged_attention_triton, write_kv_triton, rms_norm_triton,
                       rotary_triton, silu_and_mul_triton)
