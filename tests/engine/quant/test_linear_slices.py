"""The CPU layouts of engine/quant/linear.py: the LM head's column slices for a few rows and
dense layers stored transposed give F.linear's values, with and without bias, at every row
count around the cut-offs."""

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


def test_dense_layer_stored_transposed_on_cpu():
    from inflight.engine.quant.linear import DenseLinear

    gen = torch.Generator().manual_seed(1)
    w, b = torch.randn(40, 24, generator=gen), torch.randn(40, generator=gen)
    for bias in (None, b):
        layer = DenseLinear(w, bias)
        assert layer.transposed and layer.weight.shape == (40, 24) and torch.equal(layer.weight, w)
        for rows in (1, 5, 64):
            x = torch.randn(rows, 24, generator=gen)
            torch.testing.assert_close(layer(x), F.linear(x, w, bias), rtol=1e-5, atol=1e-5)
    assert not DenseLinear(w.half(), None).transposed  # other dtypes as they come
