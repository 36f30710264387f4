"""Quantized formats and the Triton W8A16 / W4A16 GEMMs against their torch references
(interpreter on CPU, tiny shapes, fp32 and fp16)."""

import pytest
import torch

from inflight.kernels.quant import (dequantize_w4, dequantize_w4_grouped, dequantize_w8, num_groups, pack_int4,
                           unpack_int4, w4a16_matmul_ref, w8a16_matmul_ref)
from inflight.kernels.triton_quant_matmul import w4a16_matmul_triton, w8a16_matmul_triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16]
TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.float16: dict(atol=2e-2, rtol=2e-2)}


def gen(seed):
    return torch.Generator().manual_seed(seed)


def test_int4_pack_unpack_round_trip():
    q = torch.randint(0, 16, (7, 10), generator=gen(0), dtype=torch.uint8)
    packed = pack_int4(q)
    assert packed.shape == (7, 5) and packed.dtype == torch.uint8
    assert torch.equal(unpack_int4(packed), q)
    # the documented layout: even k in the low nibble
    assert int(packed[0, 0]) == int(q[0, 0]) | int(q[0, 1]) << 4
    every = torch.arange(256, dtype=torch.uint8)
    assert torch.equal(pack_int4(unpack_int4(every)), every)  # all 256 bytes round-trip


@pytest.mark.parametrize("bad", [torch.tensor([[0, 16]]), torch.tensor([[-1, 3]]), torch.tensor([[1, 2, 3]])])
def test_int4_pack_rejects_bad_values(bad):
    with pytest.raises(ValueError):
        pack_int4(bad)


def test_dequantize_matches_formula():
    q = torch.randint(-127, 128, (3, 8), generator=gen(1), dtype=torch.int8)
    s = torch.rand(3, generator=gen(2), dtype=torch.float32).half()
    assert torch.equal(dequantize_w8(q, s, torch.float32), q.float() * s.float()[:, None])
    # w4 with a ragged last group: K = 12, groups of 8 -> groups [0, 8) and [8, 12)
    q4 = torch.randint(0, 16, (3, 12), generator=gen(3), dtype=torch.uint8)
    s4 = torch.rand(3, 2, generator=gen(4)).half()
    z4 = torch.randint(0, 16, (3, 2), generator=gen(5), dtype=torch.uint8)
    w = dequantize_w4(pack_int4(q4), s4, z4, 8, torch.float32)
    for n in range(3):
        for k in range(12):
            g = k // 8
            assert w[n, k] == (float(q4[n, k]) - float(z4[n, g])) * float(s4[n, g])


@pytest.mark.parametrize("n,k,group", [(3, 12, 8), (16, 256, 128), (5, 160, 128), (4, 96, 32)])
def test_grouped_dequantize_is_the_reference_bit_for_bit(n, k, group):
    """The engine's faster w4 dequantization equals the reference exactly, ragged last
    group (12 = 8 + 4, 160 = 128 + 32) and every zero point included."""
    q = torch.randint(0, 16, (n, k), generator=gen(n), dtype=torch.uint8)
    q[0, :min(16, k)] = torch.arange(min(16, k), dtype=torch.uint8)  # every nibble value
    g = num_groups(k, group)
    s = (torch.randn(n, g, generator=gen(k)) * 0.05).half()
    z = torch.randint(0, 16, (n, g), generator=gen(group), dtype=torch.uint8)
    z[0, 0], z[-1, -1] = 0, 15
    packed = pack_int4(q)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        got = dequantize_w4_grouped(packed, s, z, group, dtype)
        assert got.is_contiguous() and got.dtype == dtype and got.shape == (n, k)
        assert torch.equal(got, dequantize_w4(packed, s, z, group, dtype))


def quantized_w8(n, k, seed):
    q = torch.randint(-127, 128, (n, k), generator=gen(seed), dtype=torch.int8)
    s = (torch.rand(n, generator=gen(seed + 1)) * 0.02 + 0.001).half()
    return q.to(DEVICE), s.to(DEVICE)


def quantized_w4(n, k, group, seed):
    q = torch.randint(0, 16, (n, k), generator=gen(seed), dtype=torch.uint8)
    g = num_groups(k, group)
    s = (torch.rand(n, g, generator=gen(seed + 1)) * 0.05 + 0.005).half()
    z = torch.randint(0, 16, (n, g), generator=gen(seed + 2), dtype=torch.uint8)
    return pack_int4(q).to(DEVICE), s.to(DEVICE), z.to(DEVICE)


def activations(m, k, dtype, seed):
    return torch.randn(m, k, generator=gen(seed)).to(dtype).to(DEVICE)


# (M, N, K): a decode row, a few rows with N and K off the tile sizes, a prefill-sized block
SHAPES = [(1, 96, 192), (5, 80, 160), (33, 64, 128)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("split_k", [1, 3])
def test_w8a16_matches_reference(dtype, m, n, k, split_k):
    q, s = quantized_w8(n, k, seed=m)
    x = activations(m, k, dtype, seed=7)
    bias = torch.randn(n, generator=gen(8)).to(dtype).to(DEVICE) if m == 5 else None
    out = w8a16_matmul_triton(x, q, s, bias, split_k=split_k)
    assert out.shape == (m, n) and out.dtype == dtype
    torch.testing.assert_close(out, w8a16_matmul_ref(x, q, s, bias), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k,group", [(1, 96, 192, 64), (5, 80, 160, 32), (33, 64, 160, 128)])
@pytest.mark.parametrize("split_k", [1, 2])
def test_w4a16_matches_reference(dtype, m, n, k, group, split_k):
    """K=160 in groups of 128 leaves a ragged last group of 32 (like 576 = 4.5 x 128)."""
    q, s, z = quantized_w4(n, k, group, seed=m)
    x = activations(m, k, dtype, seed=9)
    bias = torch.randn(n, generator=gen(10)).to(dtype).to(DEVICE) if m == 5 else None
    out = w4a16_matmul_triton(x, q, s, z, group, bias, split_k=split_k)
    assert out.shape == (m, n) and out.dtype == dtype
    torch.testing.assert_close(out, w4a16_matmul_ref(x, q, s, z, group, bias), **TOL[dtype])


def test_wrappers_take_3d_input_and_empty_batches():
    q, s = quantized_w8(64, 64, seed=1)
    x = activations(6, 64, torch.float32, seed=2).view(2, 3, 64)
    torch.testing.assert_close(w8a16_matmul_triton(x, q, s), w8a16_matmul_ref(x, q, s), **TOL[torch.float32])
    q4, s4, z4 = quantized_w4(64, 64, 32, seed=3)
    empty = torch.empty(0, 64, device=DEVICE)
    assert w4a16_matmul_triton(empty, q4, s4, z4, 32).shape == (0, 64)


@pytest.mark.parametrize("scheme", ["w8", "w4"])
def test_engine_linear_layers_take_the_triton_kernels(scheme):
    """The engine's quantized layers with the triton backend (what CUDA runs) compute the
    reference: fused projections of 48 + 16 rows, 5 tokens."""
    from inflight.engine.quant.linear import W4Linear, W8Linear

    x = activations(5, 128, torch.float32, seed=11)
    if scheme == "w8":
        q, s = quantized_w8(64, 128, seed=12)
        lin, ref = W8Linear(q, s, None, torch.float32, "triton"), w8a16_matmul_ref(x, q, s)
    else:
        q, s, z = quantized_w4(64, 128, 64, seed=13)
        lin, ref = W4Linear(q, s, z, 64, None, torch.float32, "triton"), w4a16_matmul_ref(x, q, s, z, 64)
    torch.testing.assert_close(lin(x), ref, **TOL[torch.float32])
