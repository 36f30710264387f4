"""Dense layers of a few rows on CPU run in column slices (engine/quant/linear.py): the same
values as one F.linear, with and without bias, at every row count around the cut-offs."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from inflight.engine.quant.linear import COLUMN_SLICE, FEW_ROWS, dense_linear


def test_column_slices_equal_one_matmul():
    gen = torch.Generator().manual_seed(0)
    for n_out in (COLUMN_SLICE - 1, COLUMN_SLICE, 2 * COLUMN_SLICE + 37):
        w = torch.randn(n_out, 96, generator=gen)
        b = torch.randn(n_out, generator=gen)
        for rows in (1, FEW_ROWS[0], 9, FEW_ROWS[1], FEW_ROWS[1] + 1):
            x = torch.randn(rows, 96, generator=gen)
            for bias in (None, b):
                got = dense_linear(x, w, bias)
                assert got.shape == (rows, n_out)
                torch.testing.assert_close(got, F.linear(x, w, bias), rtol=1e-5, atol=1e-5)
