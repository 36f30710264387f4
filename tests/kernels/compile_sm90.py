"""Compile every Triton kernel ahead of time for an H100/H200 (sm_90), with no GPU.

Run in its own process without TRITON_INTERPRET (see test_compile.py): the interpreter
accepts code that the compiler rejects (loop-carried types, bf16 paths), so this catches
what the interpreter tests cannot. Prints one line per kernel with its shared memory.
"""

from __future__ import annotations

import inspect
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from inflight.kernels import triton_activation, triton_attention, triton_kv_write, triton_rmsnorm, triton_rotary

H100_SHARED_BYTES = 227 * 1024


def compile_sm90(kernel, types: dict[str, str], constexprs: dict, num_warps: int = 4) -> None:
    names = list(inspect.signature(kernel.fn).parameters)
    signature = {n: "constexpr" if n in constexprs else types.get(n, "i32") for n in names}
    src = ASTSource(kernel, signature, constexprs={(names.index(k),): v for k, v in constexprs.items()})
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": num_warps, "num_stages": 2})
    shared = compiled.metadata.shared
    print(f"{kernel.fn.__name__:<26} shared {shared:>6} B  {constexprs}")
    assert shared <= H100_SHARED_BYTES, f"{kernel.fn.__name__} needs {shared} B of shared memory"


ATTENTION_CONFIGS = (  # (NUM_SPLITS, BLOCK_M, TILE_N, GROUP, HEAD_DIM, SLIDING): what the wrapper picks on CUDA
    (1, 16, 32, 4, 128, False), (4, 64, 32, 1, 128, True), (1, 64, 64, 4, 64, False),
    (4, 16, 32, 3, 128, False), (1, 64, 32, 2, 256, True), (8, 16, 32, 2, 256, True))


def main(dtypes=("bf16", "fp16", "fp32"), quick: bool = False) -> int:
    configs = ATTENTION_CONFIGS[:2] if quick else ATTENTION_CONFIGS
    for dt in dtypes:
        attn = {n: f"*{dt}" for n in ("q_ptr", "k_cache_ptr", "v_cache_ptr")}
        attn.update(block_tables_ptr="*i32", seq_lens_ptr="*i32", query_start_loc_ptr="*i32",
                    scale_log2="fp32")
        for splits, block_m, tile_n, group, head_dim, sliding in configs:
            out = "*fp32" if splits > 1 else f"*{dt}"
            attn.update(out_ptr=out, m_ptr=out, l_ptr=out)
            compile_sm90(triton_attention._paged_attention_kernel, attn, dict(
                BLOCK_SIZE=16, GROUP=group, HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim,
                BLOCK_Q=block_m // group, BLOCK_M=block_m, TILE_N=tile_n, NUM_SPLITS=splits,
                SLIDING=sliding, DOT_PRECISION="ieee" if dt == "fp32" else None, QUANT=False))
        for cache in ("i8", "fp8e4nv"):  # 8-bit KV caches with fp16 scales (kernels/kv_quant.py)
            splits, block_m, tile_n, group, head_dim, sliding = configs[-1]
            out = "*fp32" if splits > 1 else f"*{dt}"
            compile_sm90(triton_attention._paged_attention_kernel, attn | dict(
                k_cache_ptr=f"*{cache}", v_cache_ptr=f"*{cache}", k_scale_ptr="*fp16",
                v_scale_ptr="*fp16", out_ptr=out, m_ptr=out, l_ptr=out), dict(
                BLOCK_SIZE=16, GROUP=group, HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim,
                BLOCK_Q=block_m // group, BLOCK_M=block_m, TILE_N=tile_n, NUM_SPLITS=splits,
                SLIDING=sliding, DOT_PRECISION="ieee" if dt == "fp32" else None, QUANT=True))
            compile_sm90(triton_kv_write._write_kv_kernel,
                         {n: f"*{dt}" for n in ("k_ptr", "v_ptr")} | dict(
                             k_cache_ptr=f"*{cache}", v_cache_ptr=f"*{cache}", slot_mapping_ptr="*i64",
                             k_scale_ptr="*fp16", v_scale_ptr="*fp16"),
                         dict(BLOCK_SIZE=16, HEAD_DIM=128, HEAD_DIM_PAD=128,
                              QUANT=1 if cache == "i8" else 2, QMAX=127.0 if cache == "i8" else 448.0,
                              MIN_SCALE=2.0 ** -24), num_warps=1)
        compile_sm90(triton_attention._merge_splits_kernel,
                     dict(out_ptr=f"*{dt}", acc_ptr="*fp32", m_ptr="*fp32", l_ptr="*fp32"),
                     dict(NUM_SPLITS=3, SPLITS_PAD=4, HEAD_DIM=128, HEAD_DIM_PAD=128))
        compile_sm90(triton_kv_write._write_kv_kernel,
                     {n: f"*{dt}" for n in ("k_ptr", "v_ptr", "k_cache_ptr", "v_cache_ptr")}
                     | dict(slot_mapping_ptr="*i64", k_scale_ptr="*i64", v_scale_ptr="*i64"),
                     dict(BLOCK_SIZE=16, HEAD_DIM=128, HEAD_DIM_PAD=128, QUANT=0, QMAX=1.0,
                          MIN_SCALE=2.0 ** -24), num_warps=1)
        for residual in (False, True):
            compile_sm90(triton_rmsnorm._rms_norm_kernel,
                         {n: f"*{dt}" for n in ("out_ptr", "res_out_ptr", "x_ptr", "res_ptr", "w_ptr")}
                         | dict(eps="fp32"),
                         dict(HAS_RESIDUAL=residual, BLOCK_N=4096), num_warps=16)
        compile_sm90(triton_rotary._rotary_kernel,
                     dict(q_ptr=f"*{dt}", k_ptr=f"*{dt}", positions_ptr="*i64", cos_sin_ptr="*fp32"),
                     dict(HALF=64, HALF_PAD=64, Q_HEADS_PAD=32, K_HEADS_PAD=8))
        compile_sm90(triton_activation._silu_and_mul_kernel, dict(out_ptr=f"*{dt}", x_ptr=f"*{dt}"),
                     dict(BLOCK=1024))
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    quick = "--quick" in args
    dtypes = tuple(a for a in args if a != "--quick") or ("bf16", "fp16", "fp32")
    sys.exit(main(dtypes, quick))
