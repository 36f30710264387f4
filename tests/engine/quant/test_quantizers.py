"""RTN and GPTQ quantizers, and the calibration / evaluation texts."""

import pytest
import torch

from inflight.engine.quant.calibration import (CALIBRATION_MODULES, EVALUATION_MODULES, _collect,
                                      docstring_text, evaluation_text, token_windows)
from inflight.engine.quant.config import QuantConfig
from inflight.engine.quant.gptq import HessianAccumulator, gptq_quantize
from inflight.engine.quant.rtn import (SEARCH_NORM, quantize_w4, quantize_w8, w4_params, w4_params_search,
                                       w4_round)
from inflight.kernels.quant import dequantize_w4, dequantize_w8, unpack_int4
from inflight.schemas.errors import ConfigError


def gen(seed):
    return torch.Generator().manual_seed(seed)


def test_w8_rtn_is_nearest_per_channel():
    w = torch.randn(16, 40, generator=gen(0)) * torch.linspace(0.01, 1.0, 16)[:, None]
    w[3] = 0.0  # an all-zero row keeps a finite scale and stays exact
    qw = quantize_w8(w)
    assert qw.qweight.dtype == torch.int8 and qw.scales.dtype == torch.float16 and qw.zeros is None
    assert int(qw.qweight.abs().max()) == 127
    s = qw.scales.float()
    err = (dequantize_w8(qw.qweight, qw.scales, torch.float32) - w).abs()
    assert (err <= s[:, None] / 2 + 1e-7).all()
    assert torch.isfinite(s).all() and (err[3] == 0).all()


def test_w4_rtn_groups_hold_their_range_and_zero():
    w = torch.randn(8, 40, generator=gen(1))  # groups of 16: [0,16) [16,32) [32,40) (ragged)
    w[:, 5] = 0.0
    w[2, 32:] = torch.linspace(0.1, 0.9, 8)     # an all-positive group: its range still holds 0
    qw = quantize_w4(w, 16)
    assert qw.qweight.shape == (8, 20) and qw.scales.shape == qw.zeros.shape == (8, 3)
    q = unpack_int4(qw.qweight)
    assert int(q.max()) <= 15 and int(qw.zeros.max()) <= 15
    deq = dequantize_w4(qw.qweight, qw.scales, qw.zeros, 16, torch.float32)
    step = qw.scales.float().repeat_interleave(16, dim=1)[:, :40]
    assert ((deq - w).abs() <= step / 2 + 1e-6).all()
    assert (deq[:, 5] == 0).all()


def test_w4_range_search_rounds_no_worse_than_the_full_range():
    """Per row, the searched (scale, zero) never round a group worse than min/max's, and an
    outlier gets clipped when that brings the other weights closer to the grid."""
    w = torch.randn(64, 32, generator=gen(8)) * 0.02
    w[:8, 0] = 0.5  # one outlier per row in the first rows

    def err(scale, zero):
        deq = (w4_round(w, scale, zero) - zero[:, None]) * scale[:, None]
        return (deq - w).abs().pow(SEARCH_NORM).sum(dim=-1)

    full, searched = err(*w4_params(w)), err(*w4_params_search(w))
    assert (searched <= full * (1 + 1e-6)).all() and searched.sum() < full.sum()
    s_full, _ = w4_params(w)
    s_search, z_search = w4_params_search(w)
    assert (s_search <= s_full + 1e-12).all() and int(z_search.max()) <= 15


@pytest.mark.parametrize("act_order", [True, False])
@pytest.mark.parametrize("quant", [QuantConfig("w8", method="gptq"), QuantConfig("w4", 32, "gptq")],
                         ids=["w8", "w4-g32"])
def test_gptq_cuts_the_output_error_of_rtn(quant, act_order):
    """On correlated inputs GPTQ's layer outputs sit closer to the full-precision ones than
    round-to-nearest's (the reason to use it), and what it returns is what it stores."""
    k, n = 96, 48
    mix = torch.randn(k, k, generator=gen(2)) / k ** 0.5
    x = torch.randn(2048, k, generator=gen(3)) @ mix + 0.05 * torch.randn(2048, k, generator=gen(4))
    w = torch.randn(n, k, generator=gen(5)) * 0.1
    acc = HessianAccumulator(k)
    for part in x.split(512):
        acc.add(part)
    qw, deq = gptq_quantize(w, acc.hessian(), quant, act_order=act_order)
    if quant.scheme == "w8":
        rtn = quantize_w8(w)
        w_rtn = dequantize_w8(rtn.qweight, rtn.scales, torch.float32)
        w_gptq = dequantize_w8(qw.qweight, qw.scales, torch.float32)
    else:
        rtn = quantize_w4(w, 32)
        w_rtn = dequantize_w4(rtn.qweight, rtn.scales, rtn.zeros, 32, torch.float32)
        w_gptq = dequantize_w4(qw.qweight, qw.scales, qw.zeros, 32, torch.float32)
    assert torch.equal(w_gptq, deq)
    y = x @ w.t()
    err_rtn = ((x @ w_rtn.t() - y) ** 2).mean()
    err_gptq = ((x @ w_gptq.t() - y) ** 2).mean()
    assert err_gptq < 0.75 * err_rtn, (float(err_gptq), float(err_rtn))


def test_gptq_tolerates_dead_inputs():
    """An input feature that is always zero (a dead channel) gets a zero weight, no NaN."""
    x = torch.randn(256, 32, generator=gen(6))
    x[:, 7] = 0.0
    acc = HessianAccumulator(32)
    acc.add(x)
    qw, deq = gptq_quantize(torch.randn(16, 32, generator=gen(7)), acc.hessian(), QuantConfig("w4", 32, "gptq"))
    assert torch.isfinite(deq).all() and (deq[:, 7] == 0).all()


def test_calibration_and_evaluation_texts_are_disjoint_and_fixed():
    assert not set(CALIBRATION_MODULES) & set(EVALUATION_MODULES)
    calib = set(_collect(CALIBRATION_MODULES))
    held_out = evaluation_text().split("\n\n")
    assert len(calib) > 500 and len(held_out) > 300
    assert not calib & set(_collect(EVALUATION_MODULES, frozenset(calib)))
    assert len(docstring_text()) > 200_000 and len("\n\n".join(held_out)) > 100_000
    assert docstring_text() == docstring_text()  # deterministic


def test_token_windows_cut_consecutive_pieces_and_refuse_short_texts():
    encode = lambda text: [ord(c) for c in text]  # noqa: E731
    assert token_windows(encode, "abcdefg", 3, 2) == [[97, 98], [99, 100], [101, 102]]
    with pytest.raises(ConfigError, match="4 asked"):
        token_windows(encode, "abcdefg", 4, 2)
