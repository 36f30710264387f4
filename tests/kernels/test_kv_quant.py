"""8-bit KV caches (int8, fp8 e4m3, one fp16 scale per token per KV head): the quantizer's
error bounds, the torch write and attention paths against attention on the dequantized
cache and on the unquantized one, and the Triton KV-write and attention kernels against
the torch reference (interpreter on CPU; fp16/fp32 queries only)."""

from __future__ import annotations

import pytest
import torch

from inflight.kernels.attention import paged_attention_ref, paged_attention_torch
from inflight.kernels.kv_quant import SCALE_DTYPE, dequantize_kv, quantize_kv
from inflight.kernels.kv_write import write_kv_ref
from tests.kernels.batches import make_batch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
KV8 = [torch.int8, torch.float8_e4m3fn]
# worst relative error of one element against its row's absmax: int8 half a step of 1/127;
# e4m3 3 mantissa bits, half an ulp (2^-4 of the value) at most
ROW_ERR = {torch.int8: 0.5 / 127 + 1e-6, torch.float8_e4m3fn: 2.0 ** -4 + 1e-6}


def quantize_batch(batch, dtype):
    """The batch's caches as an 8-bit cache + scales (the NaN rows no sequence owns get a NaN
    scale, so a kernel that reads one still fails the comparison)."""
    out = []
    for cache in (batch.k_cache, batch.v_cache):
        values, scales = quantize_kv(torch.nan_to_num(cache.float()), dtype)
        scales[cache.isnan().any(-1)] = float("nan")
        out += [values, scales]
    return out  # k, k_scale, v, v_scale


@pytest.mark.parametrize("dtype", KV8)
def test_quantize_error_is_bounded_per_row(dtype):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, 64, generator=gen) * torch.logspace(-3, 3, 64)[:, None, None]
    x[0, 0] = 0.0  # a zero row: a finite scale, zeros back
    x[1, 1, 5] = 3.0e4  # one outlier: the row's scale follows it, no clipping
    values, scales = quantize_kv(x, dtype)
    assert values.dtype == dtype and scales.dtype == SCALE_DTYPE and scales.shape == x.shape[:2]
    back = dequantize_kv(values, scales)
    assert back.isfinite().all() and (back[0, 0] == 0).all()
    amax = x.abs().amax(-1, keepdim=True)
    if dtype == torch.int8:
        err = (back - x).abs() / amax.clamp(min=1e-30)
        assert err[1:].max() <= ROW_ERR[dtype]
    else:  # relative to each element (normal range: values above 2^-6 of the row's scale)
        big = x.abs() >= amax / 448 * 2.0 ** -6 * 2
        assert ((back - x).abs() / x.abs().clamp(min=1e-30))[big].max() <= ROW_ERR[dtype]
    assert back[1, 1, 5] == pytest.approx(3.0e4, rel=ROW_ERR[dtype])


@pytest.mark.parametrize("dtype", KV8)
def test_write_ref_quantizes_into_the_slots(dtype):
    gen = torch.Generator().manual_seed(1)
    nb, bs, hkv, d = 5, 4, 2, 16
    k, v = torch.randn(6, hkv, d, generator=gen), torch.randn(6, hkv, d, generator=gen) * 10
    caches = [torch.zeros(nb, bs, hkv, d, dtype=dtype) for _ in range(2)]
    scales = [torch.full((nb, bs, hkv), 7.0, dtype=SCALE_DTYPE) for _ in range(2)]
    slots = torch.tensor([3, 17, -1, 0, 9, -1])
    write_kv_ref(k, v, caches[0], caches[1], slots, scales[0], scales[1])
    for x, cache, scale in zip((k, v), caches, scales):
        flat, flat_s = cache.view(nb * bs, hkv, d), scale.view(nb * bs, hkv)
        want_q, want_s = quantize_kv(x, dtype)
        for t, slot in enumerate(slots.tolist()):
            if slot >= 0:
                assert torch.equal(flat[slot].view(torch.uint8), want_q[t].view(torch.uint8))
                assert torch.equal(flat_s[slot], want_s[t])
        untouched = torch.ones(nb * bs, dtype=torch.bool)
        untouched[slots[slots >= 0]] = False
        assert (flat_s[untouched] == 7.0).all() and (flat[untouched].float() == 0).all()


MIXED = [(35, 5), (39, 1), (0, 9), (15, 1), (31, 1), (20, 12)]


@pytest.mark.parametrize("dtype", KV8)
@pytest.mark.parametrize("window", [None, 7])
def test_torch_attention_reads_8bit_caches(dtype, window):
    """Both torch paths on an 8-bit cache = attention on its dequantized fp32 copy, and
    close to attention on the unquantized cache (the quantization error, bounded)."""
    batch = make_batch(MIXED, block_size=16, q_heads=8, kv_heads=2, head_dim=64,
                       dtype=torch.float32, seed=1, shared_blocks=2)
    k8, ks, v8, vs = quantize_batch(batch, dtype)
    args = (batch.q, k8, v8, batch.block_tables, batch.seq_lens, batch.query_start_loc, 0.125)
    kw = dict(sliding_window=window, k_scale=ks, v_scale=vs)
    ref = paged_attention_ref(*args, **kw)
    # the fast path reads whole blocks and masks: valid pad ids and finite rows for it
    tables = torch.where(batch.block_tables < k8.shape[0], batch.block_tables, 0)
    fast = paged_attention_torch(batch.q, k8, v8, tables, *args[4:], sliding_window=window,
                                 k_scale=torch.nan_to_num(ks), v_scale=torch.nan_to_num(vs))
    assert not ref.isnan().any()
    torch.testing.assert_close(fast, ref, atol=1e-5, rtol=1e-5)
    deq = (batch.q, dequantize_kv(k8, ks), dequantize_kv(v8, vs), *args[3:])
    torch.testing.assert_close(ref, paged_attention_ref(*deq, sliding_window=window), atol=1e-5, rtol=1e-5)
    exact = paged_attention_ref(*batch.args(), 0.125, sliding_window=window)
    err = (ref - exact).abs().max().item()
    assert err < {torch.int8: 0.02, torch.float8_e4m3fn: 0.12}[dtype], err


# ---------------------------------------------------------------------------- Triton


@pytest.mark.parametrize("dtype", KV8)
@pytest.mark.parametrize("src_dtype", [torch.float32, torch.float16])
def test_triton_write_matches_ref(dtype, src_dtype):
    from inflight.kernels.triton_kv_write import write_kv_triton

    gen = torch.Generator().manual_seed(2)
    nb, bs, hkv, d = 6, 4, 3, 24  # head dim not a power of two: masked lanes
    qkv = (torch.randn(7, 2 * hkv * d + 8, generator=gen) * 4).to(src_dtype)
    qkv[2, :hkv * d] = 0  # a zero key row
    k = qkv[:, :hkv * d].view(7, hkv, d)            # strided views of a fused projection
    v = qkv[:, hkv * d:2 * hkv * d].view(7, hkv, d)
    slots = torch.tensor([5, -1, 0, 23, 11, 12, -1], dtype=torch.int64)
    got = [torch.zeros(nb, bs, hkv, d, dtype=dtype, device=DEVICE) for _ in range(2)]
    got_s = [torch.full((nb, bs, hkv), 3.0, dtype=SCALE_DTYPE, device=DEVICE) for _ in range(2)]
    want = [c.cpu().clone() for c in got]
    want_s = [s.cpu().clone() for s in got_s]
    write_kv_triton(k.to(DEVICE), v.to(DEVICE), got[0], got[1], slots.to(DEVICE), got_s[0], got_s[1])
    write_kv_ref(k, v, want[0], want[1], slots, want_s[0], want_s[1])
    for g, w, gs, ws in zip(got, want, got_s, want_s):
        if DEVICE == "cpu":  # the interpreter's IEEE fp32 math: the reference's bytes
            assert torch.equal(gs, ws) and torch.equal(g.view(torch.uint8), w.view(torch.uint8))
            continue
        # a GPU's fp32 division may round x / scale the other way at a tie: one step, rarely
        torch.testing.assert_close(gs.cpu(), ws, atol=0, rtol=2e-3)
        diff = (dequantize_kv(g.cpu(), gs.cpu()) - dequantize_kv(w, ws)).abs()
        step = ws.float()[..., None] * (1.0 if dtype == torch.int8 else 32.0)
        assert (diff <= step * 1.01).all()
        assert (g.cpu().view(torch.uint8) == w.view(torch.uint8)).float().mean() > 0.99


def _attention_case(seqs, *, block_size, q_heads, kv_heads, head_dim, q_dtype, kv_dtype, seed,
                    num_splits=None, window=None, shared_blocks=0):
    from inflight.kernels.triton_attention import paged_attention_triton

    batch = make_batch(seqs, block_size=block_size, q_heads=q_heads, kv_heads=kv_heads,
                       head_dim=head_dim, dtype=torch.float32, seed=seed, shared_blocks=shared_blocks)
    k8, ks, v8, vs = quantize_batch(batch, kv_dtype)
    q = batch.q.to(q_dtype)
    meta = (batch.block_tables, batch.seq_lens, batch.query_start_loc)
    scale = head_dim ** -0.5
    out = paged_attention_triton(*(t.to(DEVICE) for t in (q, k8, v8, *meta)), scale,
                                 num_splits=num_splits, sliding_window=window,
                                 k_scale=ks.to(DEVICE), v_scale=vs.to(DEVICE))
    ref = paged_attention_ref(q, k8, v8, *meta, scale, sliding_window=window, k_scale=ks, v_scale=vs)
    assert not out.isnan().any()
    tol = 1e-4 if q_dtype == torch.float32 else 4e-3
    torch.testing.assert_close(out.float().cpu(), ref.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("kv_dtype", KV8)
@pytest.mark.parametrize("q_dtype,head_dim,q_heads,kv_heads", [
    (torch.float32, 64, 8, 2),
    (torch.float16, 32, 4, 4),
])
def test_triton_attention_reads_8bit_caches(kv_dtype, q_dtype, head_dim, q_heads, kv_heads):
    _attention_case(MIXED, block_size=16, q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim,
                    q_dtype=q_dtype, kv_dtype=kv_dtype, seed=4, shared_blocks=2)


@pytest.mark.parametrize("kv_dtype", KV8)
def test_triton_attention_8bit_split_kv_and_window(kv_dtype):
    seqs = [(70, 1), (16, 1), (40, 6)]
    _attention_case(seqs, block_size=8, q_heads=4, kv_heads=2, head_dim=32, q_dtype=torch.float16,
                    kv_dtype=kv_dtype, seed=5, num_splits=3)
    _attention_case(seqs, block_size=8, q_heads=4, kv_heads=2, head_dim=32, q_dtype=torch.float32,
                    kv_dtype=kv_dtype, seed=6, window=9)
