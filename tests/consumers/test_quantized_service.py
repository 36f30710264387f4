"""Quantize a tiny model -> worker -> results topic -> recorder -> store: a quantized folder
serves through the unchanged service path, rows equal to `engine.generate` on it."""

from __future__ import annotations

import pytest

from schemas import SamplingParams
from tests.consumers.conftest import Service, make_settings, tiny_engine, wait_rows
from tests.quant_models import quantized

pytestmark = [pytest.mark.broker]


def test_quantized_model_serves_end_to_end(broker, tiny_model, tmp_path):
    from engine import SamplingParams as EngineParams
    from producers.client import Client
    from store import Store

    model = quantized(tiny_model, tmp_path / "w4", "w4", 32)
    url = f"sqlite:///{tmp_path / 'inflight.db'}"
    store = Store(url, create=True)
    settings = make_settings(broker, url)
    prompts = ["the quick brown fox", "hello world this is", "kafka carries prompts to workers"]
    svc = Service(settings, tiny_engine(model, dtype="bfloat16"), store)
    client = Client(settings, store=store)
    try:
        ids = [client.submit(p, SamplingParams(max_tokens=6, temperature=0.0)) for p in prompts]
        rows = wait_rows(store, ids, timeout=60)
    finally:
        svc.stop()
        client.close()
    assert all(rows[i].status == "completed" for i in ids), rows
    want = tiny_engine(model, dtype="bfloat16").generate(prompts, EngineParams(max_tokens=6, temperature=0.0))
    assert [rows[i].output_token_ids for i in ids] == [w.token_ids for w in want]
    assert all(rows[i].output == w.text for i, w in zip(ids, want))
