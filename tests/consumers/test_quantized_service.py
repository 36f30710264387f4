"""Quantize a tiny model -> worker -> results topic -> recorder -> store: a quantized folder
serves through the unchanged service path, rows equal to `engine.generate` on it; and a
request asking for logprobs gets them in its final row (OpenAI's shapes)."""

from __future__ import annotations

import pytest

from inflight.schemas import SamplingParams
from tests.consumers.conftest import Service, make_settings, tiny_engine, wait_rows
from tests.quant_models import quantized

pytestmark = [pytest.mark.broker]


def test_quantized_model_serves_end_to_end_with_logprobs(broker, tiny_model, tmp_path):
    from inflight.engine import SamplingParams as EngineParams
    from inflight.producers.client import Client
    from inflight.store import Store

    model = quantized(tiny_model, tmp_path / "w4", "w4", 32)
    url = f"sqlite:///{tmp_path / 'inflight.db'}"
    store = Store(url, create=True)
    settings = make_settings(broker, url)
    prompts = ["the quick brown fox", "hello world this is", "kafka carries prompts to workers"]
    wire = [SamplingParams(max_tokens=6, temperature=0.0),
            SamplingParams(max_tokens=6, temperature=0.0, logprobs=2, prompt_logprobs=1),
            SamplingParams(max_tokens=6, temperature=0.0)]
    svc = Service(settings, tiny_engine(model, dtype="bfloat16"), store)
    client = Client(settings, store=store)
    try:
        ids = [client.submit(p, params) for p, params in zip(prompts, wire)]
        rows = wait_rows(store, ids, timeout=60)
        with_logprobs = client.result(ids[1])
    finally:
        svc.stop()
        client.close()
    assert all(rows[i].status == "completed" for i in ids), rows
    eng = tiny_engine(model, dtype="bfloat16")
    want = eng.generate(prompts, [EngineParams(max_tokens=6, temperature=0.0, logprobs=p.logprobs,
                                               prompt_logprobs=p.prompt_logprobs) for p in wire])
    assert [rows[i].output_token_ids for i in ids] == [w.token_ids for w in want]
    assert all(rows[i].output == w.text for i, w in zip(ids, want))
    assert rows[ids[0]].logprobs is None and rows[ids[2]].logprobs is None
    stored = with_logprobs.logprobs
    assert [e["logprob"] for e in stored["content"]] == pytest.approx([e.logprob for e in want[1].logprobs])
    assert all(len(e["top_logprobs"]) == 2 for e in stored["content"])
    assert [bytes(e["bytes"]) for e in stored["content"]] == \
        [eng.tokenizer.token_bytes(t) for t in want[1].token_ids]
    prompt = stored["prompt_logprobs"]
    assert prompt[0] is None and len(prompt) == want[1].num_prompt_tokens
    assert [e["logprob"] for e in prompt[1:]] == pytest.approx([e.logprob for e in want[1].prompt_logprobs[1:]])
