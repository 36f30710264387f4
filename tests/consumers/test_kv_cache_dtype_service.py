"""INFLIGHT_KV_CACHE_DTYPE=int8 -> the worker's engine (build_engine) -> results topic ->
recorder -> store: an 8-bit KV cache serves through the unchanged service path, rows equal
to `engine.generate` with the same cache."""

from __future__ import annotations

import pytest
import torch

from inflight.schemas import SamplingParams
from tests.consumers.conftest import Service, make_settings, tiny_engine, wait_rows

pytestmark = [pytest.mark.broker]


def test_int8_kv_cache_serves_end_to_end(broker, tiny_model, tmp_path):
    from inflight.consumers.engine_bridge import build_engine
    from inflight.engine import SamplingParams as EngineParams
    from inflight.producers.client import Client
    from inflight.store import Store

    url = f"sqlite:///{tmp_path / 'inflight.db'}"
    store = Store(url, create=True)
    settings = make_settings(broker, url, kv_cache_dtype="int8", model_path=str(tiny_model),
                             kv_cache_bytes=8 << 20)
    engine = build_engine(settings)
    assert engine.runner.kv_caches[0][0].dtype == torch.int8
    prompts = ["the quick brown fox", "hello world this is", "kafka carries prompts to workers"]
    svc = Service(settings, engine, store)
    client = Client(settings, store=store)
    try:
        ids = [client.submit(p, SamplingParams(max_tokens=6, temperature=0.0)) for p in prompts]
        rows = wait_rows(store, ids, timeout=60)
    finally:
        svc.stop()
        client.close()
    assert all(rows[i].status == "completed" for i in ids), rows
    want = tiny_engine(tiny_model, kv_cache_dtype="int8").generate(
        prompts, EngineParams(max_tokens=6, temperature=0.0))
    assert [rows[i].output_token_ids for i in ids] == [w.token_ids for w in want]
