"""The C++ CPU kernels (kernels/csrc/, built by kernels/cpu_native.py) against their torch
references: the fp32 / bf16-weight decode matmuls, the fused RMSNorm, RoPE + K/V write,
SiLU * up, and the decode attention read through the block table."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from inflight.kernels.activation import silu_and_mul_ref
from inflight.kernels.attention import paged_attention_ref
from inflight.kernels.cpu_native import native
from inflight.kernels.rmsnorm import rms_norm_ref
from inflight.kernels.rotary import rope_cos_sin, rotary_ref

pytestmark = pytest.mark.skipif(native() is None, reason="the CPU kernels do not build here")


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.skipif(native() is not None and not native().f32_linear_supported(), reason="no AVX-512")
@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_decode_matmuls_match_torch(m, threads):
    w = torch.randn(70, 96, generator=gen(m))           # N not a multiple of the 4-row tile
    x, bias = torch.randn(m, 96, generator=gen(9)), torch.randn(70, generator=gen(8))
    torch.testing.assert_close(native().f32_linear(x, w, bias), F.linear(x, w, bias), atol=1e-5, rtol=1e-5)
    w16 = w.bfloat16()
    # bf16 weights widened exactly: the products of the fp32 upcast, summed in another order
    torch.testing.assert_close(native().bf16_linear(x, w16, None), F.linear(x, w16.float()), atol=1e-5, rtol=1e-5)


def test_rms_norm_adds_the_residual_in_place(threads):
    x, r, w = (torch.randn(5, 576, generator=gen(i)) for i in range(3))
    want, want_res = rms_norm_ref(x, w[0], 1e-5, r)
    got_x = x.clone()
    got = native().rms_norm(got_x, r, w[0], 1e-5)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    assert torch.equal(got_x, want_res)  # the new residual stream, in x's storage


def test_rope_write_kv_rotates_in_place_and_writes_the_slots(threads):
    H, Hkv, D, T = 6, 2, 32, 4
    qkv = torch.randn(T, (H + 2 * Hkv) * D, generator=gen(1))
    pos = torch.tensor([3, 7, 0, 100])
    table = rope_cos_sin(D, 128, 10000.0)
    q, k = qkv[:, :H * D].reshape(T, H, D).clone(), qkv[:, H * D:(H + Hkv) * D].reshape(T, Hkv, D).clone()
    rotary_ref(q, k, pos, table)
    kc, vc = torch.zeros(4, 8, Hkv, D), torch.zeros(4, 8, Hkv, D)
    slots = torch.tensor([5, 17, -1, 30])        # -1: padding, writes nothing
    got = qkv.clone()
    native().rope_write_kv(got, table, pos, H, Hkv, D, kc, vc, slots)
    assert torch.equal(got[:, :H * D].reshape(T, H, D), q)   # the same formula, the same rounding
    assert torch.equal(got[:, H * D:(H + Hkv) * D].reshape(T, Hkv, D), k)
    flat_k, flat_v = kc.view(-1, Hkv, D), vc.view(-1, Hkv, D)
    for t, s in ((0, 5), (1, 17), (3, 30)):
        assert torch.equal(flat_k[s], k[t])
        assert torch.equal(flat_v[s], qkv[t, (H + Hkv) * D:].view(Hkv, D))
    assert int((flat_k != 0).any(-1).any(-1).sum()) == 3


@pytest.mark.parametrize("width", [1536, 24])   # the vector path, and the scalar one
def test_silu_mul(width, threads):
    gu = torch.randn(7, 2 * width, generator=gen(2)) * 6
    torch.testing.assert_close(native().silu_mul(gu), silu_and_mul_ref(gu), atol=1e-6, rtol=2e-6)


@pytest.mark.parametrize("window", [None, 5, 40])
def test_decode_attention_reads_the_cache_in_place(window, threads):
    H, Hkv, D, bs = 6, 2, 64, 16
    kc, vc = torch.randn(40, bs, Hkv, D, generator=gen(3)), torch.randn(40, bs, Hkv, D, generator=gen(4))
    tables = torch.randperm(40, generator=gen(5))[:5 * 8].view(5, 8).int()
    lens = torch.tensor([1, 17, 100, 128, 0], dtype=torch.int32)   # 0: a padding row
    q = torch.randn(5, H, D, generator=gen(6))
    want = paged_attention_ref(q, kc, vc, tables, lens, torch.arange(6, dtype=torch.int32), 0.125,
                               sliding_window=window)
    got = native().decode_attention(q, kc, vc, tables, lens, 0.125, window or -1)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)
    assert torch.equal(got[4], torch.zeros_like(got[4]))


def test_kernels_refuse_bad_inputs_with_a_message():
    with pytest.raises(RuntimeError, match="fp32"):
        native().rms_norm(torch.zeros(2, 8, dtype=torch.float16), None, torch.ones(8), 1e-5)
    with pytest.raises(RuntimeError, match="out of range"):
        native().rope_write_kv(torch.zeros(1, 4 * 8), rope_cos_sin(8, 4, 1e4), torch.tensor([9]), 2, 1, 8,
                               torch.zeros(1, 2, 1, 8), torch.zeros(1, 2, 1, 8), torch.tensor([0]))
