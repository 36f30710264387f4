"""The engine's fast torch paged attention equals the reference, on mixed batches."""

from __future__ import annotations

import pytest
import torch

from inflight.kernels.attention import paged_attention_ref, paged_attention_torch


def case(q_lens, ctx_lens, dtype, Hq=6, Hkv=2, D=16, bs=4, nb=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    kc = torch.randn(nb, bs, Hkv, D, generator=g).to(dtype)
    vc = torch.randn(nb, bs, Hkv, D, generator=g).to(dtype)
    M = max(-(-c // bs) for c in ctx_lens) + 1
    tables = torch.randperm(nb, generator=g)[:len(q_lens) * M].view(len(q_lens), M).int()
    qsl = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    q = torch.randn(int(qsl[-1]), Hq, D, generator=g).to(dtype)
    return q, kc, vc, tables, torch.tensor(ctx_lens, dtype=torch.int32), qsl


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("q_lens,ctx_lens", [
    ([1, 1, 1], [1, 7, 30]),                       # decodes only
    ([9], [9]),                                     # one fresh prefill
    ([1, 5, 1, 12, 3], [17, 5, 4, 20, 3]),          # mixed, prefills with cached prefixes
    ([4, 1], [16, 33]),
])
def test_torch_equals_reference(q_lens, ctx_lens, dtype, tol):
    args = case(q_lens, ctx_lens, dtype)
    ref = paged_attention_ref(*args, 0.25)
    got = paged_attention_torch(*args, 0.25)
    assert got.dtype == ref.dtype and got.shape == ref.shape
    torch.testing.assert_close(got.float(), ref.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("window", [1, 3, 6, 50])
@pytest.mark.parametrize("q_lens,ctx_lens", [
    ([1, 1, 1], [1, 7, 30]),
    ([9], [9]),
    ([1, 5, 1, 12, 3], [17, 5, 4, 20, 3]),
])
def test_torch_sliding_window_equals_reference(q_lens, ctx_lens, window):
    args = case(q_lens, ctx_lens, torch.float32, seed=window)
    ref = paged_attention_ref(*args, 0.25, sliding_window=window)
    got = paged_attention_torch(*args, 0.25, sliding_window=window)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    if window < max(ctx_lens):  # the window matters here
        assert not torch.allclose(paged_attention_ref(*args, 0.25), ref, atol=1e-4)


def test_reference_window_is_transformers_mask():
    """Query at p sees keys p - W + 1 .. p: transformers' `kv_idx > q_idx - W` on top of
    the causal mask, checked against a dense masked softmax."""
    W, L = 4, 11
    q, kc, vc, tables, lens, qsl = case([L], [L], torch.float32, Hq=2, Hkv=2, D=8, bs=4)
    got = paged_attention_ref(q, kc, vc, tables, lens, qsl, 0.5, sliding_window=W)
    pos = torch.arange(L)
    k = kc[tables[0, pos // 4].long(), pos % 4]  # [L, H, D]
    v = vc[tables[0, pos // 4].long(), pos % 4]
    scores = torch.einsum("qhd,khd->hqk", q, k) * 0.5
    visible = (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - W)
    want = torch.einsum("hqk,khd->qhd", scores.masked_fill(~visible, float("-inf")).softmax(-1), v)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
