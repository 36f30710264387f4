"""The CPU forward's planned paged attention equals `paged_attention_torch` (itself tested
against the reference), on every shape of step it plans for: decodes only, a lone decode
over consecutive or scattered blocks, mixed steps, sliding windows, 8-bit caches and
padding rows."""

from __future__ import annotations

import pytest
import torch

from inflight.kernels.attention import paged_attention_ref, paged_attention_torch
from inflight.kernels.cpu_attention import paged_attention_planned, plan_attention
from inflight.kernels.kv_quant import quantize_kv


def case(q_lens, ctx_lens, *, consecutive=False, Hq=6, Hkv=2, D=16, bs=4, nb=96, seed=0,
         dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    kc = torch.randn(nb, bs, Hkv, D, generator=g).to(dtype)
    vc = torch.randn(nb, bs, Hkv, D, generator=g).to(dtype)
    M = max(-(-c // bs) for c in ctx_lens) + 1
    ids = torch.arange(len(q_lens) * M) + 5 if consecutive else torch.randperm(nb, generator=g)[:len(q_lens) * M]
    tables = ids.view(len(q_lens), M).int()
    qsl = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    q = torch.randn(int(qsl[-1]), Hq, D, generator=g).to(dtype)
    return q, kc, vc, tables, torch.tensor(ctx_lens, dtype=torch.int32), qsl


STEPS = [
    ([1, 1, 1], [1, 7, 30]),               # decodes only
    ([1], [23]),                           # a lone decode
    ([9], [9]),                            # one fresh prefill
    ([1, 5, 1, 12, 3], [17, 5, 4, 20, 3]),  # mixed, prefills with cached prefixes
    ([4, 1], [16, 33]),                    # a lone decode beside a prefill
]


def planned(q, kc, vc, tables, lens, qsl, scale, window=None, **scales):
    plan = plan_attention(tables, lens, qsl, kc.shape[1], window)
    return paged_attention_planned(q, kc, vc, plan, scale, scales.get("k_scale"), scales.get("v_scale"))


@pytest.mark.parametrize("consecutive", [False, True], ids=["scattered", "consecutive"])
@pytest.mark.parametrize("window", [None, 1, 6, 50])
@pytest.mark.parametrize("q_lens,ctx_lens", STEPS)
def test_planned_equals_torch_path(q_lens, ctx_lens, window, consecutive):
    args = case(q_lens, ctx_lens, consecutive=consecutive, seed=len(q_lens))
    want = paged_attention_torch(*args, 0.25, sliding_window=window)
    got = planned(*args, 0.25, window)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_planned_bf16_matches_reference():
    args = case([1, 5, 1, 12, 3], [17, 5, 4, 20, 3], dtype=torch.bfloat16)
    got = planned(*args, 0.25)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), paged_attention_ref(*args, 0.25).float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn])
@pytest.mark.parametrize("q_lens,ctx_lens", STEPS)
def test_planned_reads_8bit_caches(q_lens, ctx_lens, dtype):
    q, kc, vc, tables, lens, qsl = case(q_lens, ctx_lens, consecutive=len(q_lens) == 1)
    (k8, ks), (v8, vs) = quantize_kv(kc, dtype), quantize_kv(vc, dtype)
    want = paged_attention_torch(q, k8, v8, tables, lens, qsl, 0.25, k_scale=ks, v_scale=vs)
    got = planned(q, k8, v8, tables, lens, qsl, 0.25, k_scale=ks, v_scale=vs)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_padding_rows_are_zero():
    """A padded decode step (CUDA-graph layout, run eagerly on CPU): seq_len 0 rows read no
    cache and give zeros."""
    q, kc, vc, tables, _, qsl = case([1, 1, 1, 1], [5, 9, 1, 1])
    lens = torch.tensor([5, 9, 0, 0], dtype=torch.int32)
    got = planned(q, kc, vc, tables, lens, qsl, 0.25)
    want = paged_attention_torch(q, kc, vc, tables, lens, qsl, 0.25)
    assert torch.equal(got[2:], torch.zeros_like(got[2:]))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_a_lone_decode_over_consecutive_blocks_reads_a_view():
    """No gather: the plan names a block range, not block ids."""
    q, kc, vc, tables, lens, qsl = case([1], [23], consecutive=True)
    plan = plan_attention(tables, lens, qsl, kc.shape[1])
    assert plan.decodes.span is not None and plan.decodes.span.idx is None
    scattered = case([1], [23], seed=3)
    assert plan_attention(*scattered[3:], kc.shape[1]).decodes.span.idx is not None
