"""torch's packed int8 / int4 CPU matmuls and the project's fp32 ones (kernels/quant_cpu.py,
kernels/csrc/cpu_quant_linear.cpp), and the engine's quantized linear layers on every path
they take, against the dequantizing references."""

import pytest
import torch

from inflight.engine.quant.linear import W4Linear, W8Linear
from inflight.kernels.quant import num_groups, pack_int4, w4a16_matmul_ref, w8a16_matmul_ref
from inflight.kernels.quant_cpu import (INT4_PACKED_MAX_ROWS, INT8_PACKED_MAX_ROWS, W4_KERNEL_MAX_ROWS,
                                       W8_KERNEL_MAX_ROWS, Int4PackedCPU, W4PackedCPU, W8PackedCPU,
                                       aligned, interleave, native, split_int4, w8a16_matmul_cpu)

TOL = {torch.bfloat16: dict(atol=3e-2, rtol=2e-2), torch.float16: dict(atol=5e-3, rtol=5e-3),
       torch.float32: dict(atol=1e-5, rtol=1e-5)}


def gen(seed):
    return torch.Generator().manual_seed(seed)


def w8(n, k, seed=0):
    return (torch.randint(-127, 128, (n, k), generator=gen(seed), dtype=torch.int8),
            (torch.rand(n, generator=gen(seed + 1)) * 0.01 + 0.001).half())


def w4(n, k, group, seed=0):
    g = num_groups(k, group)
    return (pack_int4(torch.randint(0, 16, (n, k), generator=gen(seed), dtype=torch.uint8)),
            (torch.rand(n, g, generator=gen(seed + 1)) * 0.02 + 0.002).half(),
            torch.randint(0, 16, (n, g), generator=gen(seed + 2), dtype=torch.uint8))


def x_of(m, k, dtype, seed=5):
    return torch.randn(m, k, generator=gen(seed)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_int8_packed_matches_reference(dtype):
    q, s = w8(48, 96)
    x = x_of(3, 96, dtype)
    bias = torch.randn(48, generator=gen(9)).to(dtype)
    got = w8a16_matmul_cpu(x, aligned(q), s.to(dtype), bias)
    torch.testing.assert_close(got.float(), w8a16_matmul_ref(x.float(), q, s, bias.float()), **TOL[dtype])


def test_aligned_copies_only_misaligned_tensors():
    buf = torch.zeros(1024, dtype=torch.int8)
    assert aligned(buf) is buf
    view = buf[8:]  # 8 bytes off a 64-byte boundary
    fixed = aligned(view)
    assert fixed.data_ptr() % 64 == 0 and torch.equal(fixed, view)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("k,group", [(128, 32), (160, 128)])  # 160 = 128 + a ragged 32: padded
def test_int4_packed_matches_reference(dtype, k, group):
    q, s, z = w4(32, k, group)
    packed = Int4PackedCPU.from_w4(q, s, z, group, dtype)
    x = x_of(5, k, dtype)
    got = packed.matmul(x)
    torch.testing.assert_close(got.float(), w4a16_matmul_ref(x.float(), q, s, z, group), **TOL[dtype])


needs_native = pytest.mark.skipif(native() is None, reason="the fp32 CPU kernels do not build here")


@needs_native
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 7, 9])   # every tile height and remainder
def test_fp32_int8_kernel_matches_reference(m, threads):
    q, s = w8(44, 96, seed=m)                        # N = 11 tiles of 4 rows
    x = x_of(m, 96, torch.float32)
    bias = torch.randn(44, generator=gen(9))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = W8PackedCPU.from_w8(q, s).matmul(x, bias)
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(got, w8a16_matmul_ref(x, q, s, bias), **TOL[torch.float32])


@needs_native
@pytest.mark.parametrize("m", [1, 3, 6])
@pytest.mark.parametrize("k,group", [(128, 32), (160, 128), (192, 64), (576, 128)])  # ragged last groups too
def test_fp32_int4_kernel_matches_reference(m, k, group):
    q, s, z = w4(20, k, group, seed=k)
    x = x_of(m, k, torch.float32)
    got = W4PackedCPU.from_w4(q, s, z, group).matmul(x)
    torch.testing.assert_close(got, w4a16_matmul_ref(x, q, s, z, group), atol=2e-5, rtol=1e-5)


def test_fp32_kernel_layouts():
    """split_int4: per 32 values, byte i holds k = 32c + i low and 32c + 16 + i high;
    interleave: each 4 rows' runs side by side."""
    q = torch.arange(64, dtype=torch.uint8).remainder(16).view(1, 64)
    split = split_int4(pack_int4(q))
    assert split[0, 0] == (0 | 0 << 4) and split[0, 1] == (1 | 1 << 4) and split[0, 16] == (0 | 0 << 4)
    rows = torch.arange(4 * 32, dtype=torch.uint8).view(4, 32)
    inter = interleave(rows, 16)
    assert inter.flatten()[:32].tolist() == rows[0, :16].tolist() + rows[1, :16].tolist()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_linear_layers_match_reference_on_every_path(dtype):
    """Rows at and past each kernel's limit: both sides of the CPU dispatch."""
    q, s = w8(64, 96, seed=1)
    q4, s4, z4 = w4(64, 160, 128, seed=2)
    lin8 = W8Linear(q, s, None, dtype, "torch")
    lin4 = W4Linear(q4, s4, z4, 128, None, dtype, "torch")
    assert (lin8.cpu_scales is not None) == (lin4.cpu_packed is not None) == (dtype != torch.float32)
    fp32_kernels = dtype == torch.float32 and native() is not None
    assert (lin8.cpu_fp32 is not None) == (lin4.cpu_fp32 is not None) == fp32_kernels
    for m in (1, INT8_PACKED_MAX_ROWS, INT8_PACKED_MAX_ROWS + 1, INT4_PACKED_MAX_ROWS, INT4_PACKED_MAX_ROWS + 1,
              W4_KERNEL_MAX_ROWS, W4_KERNEL_MAX_ROWS + 1, W8_KERNEL_MAX_ROWS, W8_KERNEL_MAX_ROWS + 1):
        x8, x4 = x_of(m, 96, dtype), x_of(m, 160, dtype)
        torch.testing.assert_close(lin8(x8).float(), w8a16_matmul_ref(x8.float(), q, s), **TOL[dtype])
        torch.testing.assert_close(lin4(x4).float(), w4a16_matmul_ref(x4.float(), q4, s4, z4, 128), **TOL[dtype])
