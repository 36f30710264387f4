"""The verification-cost curve is measured on the engine's own runner at start-up, kept
under the cache dir, and read back by the next engine (engine/spec/verify_costs.py)."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from inflight.engine.spec import verify_costs
from inflight.engine.spec.verify_costs import interpolate
from tests.engine.spec.conftest import make, methods

K = 6


def test_interpolate_is_linear_between_points_and_never_decreasing():
    assert interpolate({0: 1.0, 2: 1.2, 4: 1.1, 6: 1.7}, 6) == [1.0, 1.1, 1.2, 1.2, 1.2, 1.4, 1.7]
    assert interpolate({0: 1.0, 1: 0.97, 3: 1.3}, 3) == [1.0, 1.0, 1.135, 1.3]


def test_costs_are_measured_once_cached_and_read_back(tiny_model_path, tmp_path, monkeypatch, caplog):
    spec = {**methods(tiny_model_path, tiny_model_path)["ngram"], "num_speculative_tokens": K}
    caplog.set_level(logging.INFO, logger=verify_costs.__name__)
    eng = make(tiny_model_path, spec, cache_dir=tmp_path)
    costs = eng.spec.costs
    assert len(costs) == K + 1 and costs[0] == 1.0
    assert all(a <= b for a, b in zip(costs, costs[1:]))
    assert any("measured" in r.getMessage() for r in caplog.records)
    # the calibration left nothing behind: no batch row, every block free
    assert not eng.runner.batch.row_of and eng.kv.pool.num_free_blocks == eng.num_kv_blocks
    files = list((tmp_path / verify_costs.CACHE_FOLDER).glob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["costs"] == costs

    def no_measuring(*a, **kw):
        raise AssertionError("measured again instead of reading the cache")

    caplog.clear()
    with monkeypatch.context() as m:
        m.setattr(verify_costs, "measure_costs", no_measuring)
        again = make(tiny_model_path, spec, cache_dir=tmp_path)
    assert again.spec.costs == costs
    assert any("read from" in r.getMessage() for r in caplog.records)
    # another thread count is another machine: measured again, in a file of its own
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        make(tiny_model_path, spec, cache_dir=tmp_path)
    finally:
        torch.set_num_threads(threads)
    assert len(list((tmp_path / verify_costs.CACHE_FOLDER).glob("*.json"))) == 2


def test_a_fixed_draft_token_cost_measures_nothing(tiny_model_path, tmp_path, monkeypatch):
    monkeypatch.setattr(verify_costs, "measure_costs", pytest.fail)
    spec = {**methods(tiny_model_path, tiny_model_path)["ngram"], "draft_token_cost": 0.25}
    eng = make(tiny_model_path, spec, cache_dir=tmp_path)
    assert eng.spec.costs == [1.0 + 0.25 * d for d in range(5)]


def test_without_a_cache_dir_the_documented_curve_is_read(tiny_model_path, monkeypatch):
    """Nothing measured (seeded outputs then do not depend on one start's noise): the
    CPU curve of verify_costs.json, extended past its end by its slope."""
    monkeypatch.setattr(verify_costs, "measure_costs", pytest.fail)
    spec = {**methods(tiny_model_path, tiny_model_path)["ngram"], "num_speculative_tokens": 20}
    costs = make(tiny_model_path, spec).spec.costs
    curve = json.loads(verify_costs.DEFAULTS_FILE.read_text())["cpu"]
    assert costs[:17] == curve["costs"] and abs(costs[20] - costs[16] - 4 * curve["slope"]) < 1e-9
