"""Compile the W8A16 / W4A16 GEMMs for an H100/H200 (sm_90) with no GPU, in bf16 and fp16,
with and without split-K (what `pick_tiles` can choose on CUDA). Run without
TRITON_INTERPRET, in its own process (see test_compile.py). One line per kernel variant."""

from __future__ import annotations

import sys

from inflight.kernels import triton_quant_matmul as qm
from tests.kernels.compile_sm90 import compile_sm90


def main(dtypes=("bf16", "fp16"), quick: bool = False) -> int:
    """Both kernels with and without split-K (quick: w8 split, w4 unsplit with bias; the
    two share their load and store helpers)."""
    for dt in dtypes:
        for block_m, split in ((16, 8), (64, 1)):
            out = "*fp32" if split > 1 else f"*{dt}"
            common = dict(out_ptr=out, x_ptr=f"*{dt}", s_ptr="*fp16", bias_ptr=f"*{dt}")
            tiles = dict(HAS_BIAS=split == 1, BLOCK_M=block_m, BLOCK_N=64, SPLIT_K=split,
                         DOT_PRECISION=None)
            if not quick or split > 1:
                compile_sm90(qm._w8a16_kernel, common | dict(q_ptr="*i8"), tiles | dict(BLOCK_K=64))
            if not quick or split == 1:
                compile_sm90(qm._w4a16_kernel, common | dict(q_ptr="*u8", z_ptr="*u8"),
                             tiles | dict(BLOCK_K=64, GROUP_SIZE=128))
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(main(tuple(a for a in args if a != "--quick") or ("bf16", "fp16"), "--quick" in args))
