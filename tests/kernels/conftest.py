"""Kernel tests run the Triton kernels on CPU under the Triton interpreter.

TRITON_INTERPRET is read when a kernel is decorated (at import of kernels.triton_*), so it
is set here, before any test module imports them. It only changes how Triton kernels run;
nothing outside kernels.triton_* uses Triton on CPU.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
