"""Logprobs from the engine to the wire and the store: OpenAI's shapes (token text, bytes,
top_logprobs), built by the worker's LogprobShaper, read back by the FinalEvent model and
stored in requests.logprobs."""

from __future__ import annotations

import math

import pytest

from inflight.consumers import event_bytes
from inflight.consumers.engine_bridge import LOGPROB_FLOOR, LogprobShaper
from inflight.engine import Engine, EngineConfig, RequestOutput, SamplingParams
from inflight.engine.logprobs import TokenLogprob
from inflight.schemas import FinalEvent, InferenceRequest, SchemaError, decode_result
from inflight.store.rows import final_row


@pytest.fixture(scope="module")
def engine(tiny_model):
    return Engine(EngineConfig(model=tiny_model, num_kv_blocks=64))


def test_wire_params_reach_the_engine_and_are_bounded():
    req = InferenceRequest.model_validate({"request_id": "r", "prompt": "hi",
                                           "params": {"logprobs": 3, "prompt_logprobs": 0}})
    p = req.params
    assert isinstance(p, SamplingParams)
    assert (p.logprobs, p.prompt_logprobs) == (3, 0)
    for bad in (21, -1, "2"):
        with pytest.raises(Exception):
            InferenceRequest.model_validate({"request_id": "r", "prompt": "hi", "params": {"logprobs": bad}})


def test_final_event_carries_openai_shaped_logprobs(engine):
    from inflight.engine import SamplingParams

    out = engine.generate(["hello world 🙂 ünïcödé"], SamplingParams(
        max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=2, prompt_logprobs=1))[0]
    shaper = LogprobShaper(engine.tokenizer)
    lps, prompt_lps = shaper(out)
    data = event_bytes.final_event("r-1", "g.1", out, worker="w", batch_id=None, submitted_at=None,
                                   queued_at=1.0, logprobs=lps, prompt_logprobs=prompt_lps)
    event = decode_result(data)
    assert isinstance(event, FinalEvent)
    content = event.logprobs.content
    assert len(content) == len(out.token_ids) == 6
    for entry, engine_entry in zip(content, out.logprobs):
        assert entry.logprob == pytest.approx(engine_entry.logprob)
        assert len(entry.top_logprobs) == 2 and entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
    # the tokens' bytes spell the output exactly (byte-level pieces may split characters)
    assert b"".join(bytes(e.bytes) for e in content).decode("utf-8", "replace") == \
        engine.tokenizer.decode(out.token_ids, skip_special_tokens=False)
    prompt = event.prompt_logprobs
    assert prompt[0] is None and len(prompt) == out.num_prompt_tokens
    text = b"".join(bytes(e.bytes) for e in prompt[1:]).decode()
    assert "world 🙂 ünïcödé" in text
    row = final_row(event)
    assert row["logprobs"]["content"][0]["token"] == content[0].token
    assert row["logprobs"]["prompt_logprobs"][0] is None and len(row["logprobs"]["prompt_logprobs"]) == len(prompt)


def test_shaper_writes_split_characters_and_infinities_openai_style(engine):
    shaper = LogprobShaper(engine.tokenizer)
    from inflight.engine.tokenizer import _gpt2_unicode_to_byte

    emoji = engine.tokenizer.encode("🙂")
    lead = next(ch for ch, b in _gpt2_unicode_to_byte().items() if b == 0xF0)
    partial = engine.tokenizer.hf.token_to_id(lead)  # the byte-level token of byte 0xF0 alone
    entries = [TokenLogprob(emoji[0], -math.inf, 1, ((emoji[0], float("nan")),))]
    out = RequestOutput("x", [], "", emoji[:1], "", True, "stop", logprobs=entries)
    lps, prompt_lps = shaper(out)
    first = lps["content"][0]
    assert first["logprob"] == LOGPROB_FLOOR and first["top_logprobs"][0]["logprob"] == LOGPROB_FLOOR
    assert prompt_lps is None
    text, raw = shaper.piece(partial)  # the first byte of a 4-byte character
    assert text == "bytes:\\xf0" and raw == [0xF0]
    event = decode_result(event_bytes.final_event("x", "g", out, worker="w", batch_id=None,
                                                  submitted_at=None, queued_at=0.0, logprobs=lps))
    assert event.logprobs.content[0].logprob == LOGPROB_FLOOR


def test_final_event_rejects_malformed_logprobs():
    with pytest.raises(SchemaError):
        decode_result(b'{"type":"final","request_id":"r","text":"","finish_reason":"stop",'
                      b'"logprobs":{"content":[{"token":"a","logprob":"high"}]}}')
