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
