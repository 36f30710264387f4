"""Dense layers on CPU (engine/quant/linear.py): a few rows against a big fp32 weight go
through oneDNN, everything else through F.linear, with F.linear's values either way (with
and without bias, at every row count around the cut-offs, big and small weights)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from inflight.engine.quant import linear
from inflight.engine.quant.linear import ONEDNN_MIN_BYTES, ONEDNN_ROWS, DenseLinear, takes_onednn


def test_few_rows_through_onednn_equal_f_linear():
    gen = torch.Generator().manual_seed(0)
    K = 64
    big = ONEDNN_MIN_BYTES // (4 * K)  # rows of an [N, K] fp32 weight of ONEDNN_MIN_BYTES
    lo, hi = ONEDNN_ROWS
    for n_out in (big - 1, big + 37):
        w, b = torch.randn(n_out, K, generator=gen), torch.randn(n_out, generator=gen)
        for bias in (None, b):
            layer = DenseLinear(w, bias)
            for rows in (1, lo - 1, lo, 9, hi, hi + 1):
                x = torch.randn(rows, K, generator=gen)
                want = linear._ONEDNN and n_out >= big and lo <= rows <= hi
                assert takes_onednn(x, w) == want, (n_out, rows)
                got = layer(x)
                assert got.shape == (rows, n_out)
                torch.testing.assert_close(got, F.linear(x, w, bias), rtol=1e-5, atol=1e-4)
    x = torch.randn(9, K, generator=gen)
    w = torch.randn(big + 1, K, generator=gen)
    assert takes_onednn(x, w) == linear._ONEDNN and not takes_onednn(x.half(), w.half())
    t = torch.randn(K, 9, generator=gen).t()  # a non-contiguous input
    torch.testing.assert_close(DenseLinear(w, None)(t), F.linear(t, w), rtol=1e-5, atol=1e-4)
