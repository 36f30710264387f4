"""Triton KV write, RMSNorm, rotary and SwiGLU against their torch references (interpreter on CPU)."""

import pytest
import torch

from inflight.kernels.activation import silu_and_mul_ref
from inflight.kernels.kv_write import write_kv_ref
from inflight.kernels.rmsnorm import rms_norm_ref
from inflight.kernels.rotary import rope_cos_sin, rotary_ref
from inflight.kernels.triton_activation import silu_and_mul_triton
from inflight.kernels.triton_kv_write import write_kv_triton
from inflight.kernels.triton_rmsnorm import rms_norm_triton
from inflight.kernels.triton_rotary import rotary_triton

DTYPES = [torch.float32, torch.float16]
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float16: dict(atol=1e-3, rtol=1e-3)}
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def randn(*shape, dtype, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_write_kv(dtype, head_dim):
    T, Hkv, nb, bs = 7, 2, 5, 4
    # k, v as strided views of a fused qkv projection; one skipped token (slot -1), a slot on
    # a block's last row and one on a block's first row.
    qkv = randn(T, 4 + 2 * Hkv, head_dim, dtype=dtype, seed=0)
    k, v = qkv[:, 4:4 + Hkv], qkv[:, 4 + Hkv:]
    slots = torch.tensor([3, 4, -1, 17, 0, 19, 8], dtype=torch.int64, device=DEVICE)
    caches = [randn(nb, bs, Hkv, head_dim, dtype=dtype, seed=s) for s in (1, 2)]
    ref_k, ref_v = caches[0].clone(), caches[1].clone()
    write_kv_ref(k, v, ref_k, ref_v, slots)
    write_kv_triton(k, v, caches[0], caches[1], slots)
    assert torch.equal(caches[0], ref_k) and torch.equal(caches[1], ref_v)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm(dtype, with_residual):
    x = randn(5, 3, 96, dtype=dtype, seed=0)       # 3-D input, hidden not a power of two
    w = randn(96, dtype=dtype, seed=1)
    res = randn(5, 3, 96, dtype=dtype, seed=2) if with_residual else None
    out, new_res = rms_norm_triton(x, w, 1e-6, res)
    ref_out, ref_res = rms_norm_ref(x, w, 1e-6, res)
    assert out.shape == x.shape and out.dtype == x.dtype
    torch.testing.assert_close(out, ref_out, **TOL[dtype])
    torch.testing.assert_close(new_res, ref_res, **TOL[dtype])
    if not with_residual:
        assert new_res is x


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim,q_heads,kv_heads", [(64, 6, 2), (128, 4, 4)])
def test_rotary(dtype, head_dim, q_heads, kv_heads):
    T = 6
    qkv = randn(T, q_heads + 2 * kv_heads, head_dim, dtype=dtype, seed=0)
    q, k = qkv[:, :q_heads], qkv[:, q_heads:q_heads + kv_heads]   # in-place on views
    positions = torch.tensor([0, 1, 2, 37, 38, 100], device=DEVICE)
    cos_sin = rope_cos_sin(head_dim, 128, 500000.0, device=DEVICE)
    ref_q, ref_k = q.clone(), k.clone()
    rotary_ref(ref_q, ref_k, positions, cos_sin)
    untouched = qkv[:, q_heads + kv_heads:].clone()
    rotary_triton(q, k, positions, cos_sin)
    torch.testing.assert_close(q, ref_q, **TOL[dtype])
    torch.testing.assert_close(k, ref_k, **TOL[dtype])
    assert torch.equal(qkv[:, q_heads + kv_heads:], untouched)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul(dtype):
    x = randn(2, 3, 2 * 80, dtype=dtype, seed=0)
    out = silu_and_mul_triton(x)
    ref = silu_and_mul_ref(x)
    assert out.shape == ref.shape == (2, 3, 80)
    torch.testing.assert_close(out, ref, **TOL[dtype])


def test_triton_ops_set():
    from inflight.kernels.ops import get_ops

    ops = get_ops("triton")
    assert ops.name == "triton" and ops.paged_attention.__name__ == "paged_attention_triton"
