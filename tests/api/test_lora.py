"""LoRA adapters through the whole path (real broker, a worker serving a tiny model with
two adapters, the recorder, SQLite): /v1/models lists them with `parent`; the openai SDK
(`model="adapter-a"`) and the Kafka Client get each adapter's tokens, equal to the engine's
alone, in the same run as the base model's; an unknown adapter is model_not_found."""

from __future__ import annotations

import time

import openai
import pytest

from inflight.engine import SamplingParams as EP
from tests.api.server import ApiServer
from tests.consumers.conftest import Service, finals_of, make_settings, migrated, tiny_engine, wait_rows
from tests.lora_adapters import write_peft_adapter

pytestmark = [pytest.mark.broker]

BASE, A, B = "tiny", "adapter-a", "adapter-b"
PROMPT = [5, 17, 42, 9, 100, 7, 33]


def lora_engine(model, adapters):
    eng = tiny_engine(model, max_loras=2, max_lora_rank=8)
    for name, path in adapters.items():
        eng.add_lora(name, path)
    return eng


@pytest.fixture(scope="module")
def adapters(tiny_model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("adapters")
    return {A: write_peft_adapter(tmp / "a", tiny_model, r=8, target_modules=["q_proj", "v_proj"], seed=1),
            B: write_peft_adapter(tmp / "b", tiny_model, r=4, target_modules=["o_proj", "down_proj"], seed=2)}


@pytest.fixture(scope="module")
def expected(tiny_model, adapters):
    eng = lora_engine(tiny_model, adapters)
    for model in (None, A, B):
        eng.add_request(str(model), prompt_token_ids=PROMPT, lora=model,
                        params=EP(max_tokens=8, temperature=0.0, ignore_eos=True))
    return {None if k == "None" else k: o for k, o in finals_of(eng).items()}


def test_adapters_over_kafka_and_the_openai_sdk(broker, tiny_model, adapters, expected, tmp_path):
    from inflight.api.keys import create_key
    from inflight.producers.client import Client
    from inflight.schemas import SamplingParams
    from inflight.store import Store

    url = migrated(f"sqlite:///{tmp_path / 'db.sqlite'}")
    settings = make_settings(broker, url, default_model=BASE, served_model_name=BASE,
                             registry_heartbeat_s=0.3, registry_ttl_s=3.0, api_key_cache_s=0.0,
                             api_wait_timeout_s=60.0, data_dir=tmp_path / "data",
                             cache_dir=tmp_path / "cache")
    assert len({tuple(o.token_ids) for o in expected.values()}) == 3  # each adapter changes the tokens
    store = Store(url)
    service = Service(settings, lora_engine(tiny_model, adapters), store)
    client = Client(settings, store=store)
    try:
        with ApiServer(settings) as api:
            key = create_key(api.ctx.store, "test")
            sdk = openai.OpenAI(base_url=api.url + "/v1", api_key=key.token, max_retries=0, timeout=60)
            deadline = time.monotonic() + 20
            while {m.id for m in sdk.models.list().data} != {BASE, A, B} and time.monotonic() < deadline:
                time.sleep(0.2)
            models = {m.id: m for m in sdk.models.list().data}
            assert set(models) == {BASE, A, B}
            assert models[A].parent == BASE and models[B].parent == BASE and models[BASE].parent is None
            for model in (BASE, A, B):
                done = sdk.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0,
                                              extra_body={"ignore_eos": True})
                assert done.model == model
                assert done.choices[0].text == expected[None if model == BASE else model].text, model
            with pytest.raises(openai.NotFoundError, match="model_not_found|does not exist"):
                sdk.completions.create(model="adapter-x", prompt=PROMPT, max_tokens=2)

        params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
        ids = {model: client.submit(PROMPT, params, model=model) for model in (B, A, None)}
        rows = wait_rows(store, list(ids.values()))
        for model, rid in ids.items():
            assert rows[rid].status == "completed", rows[rid].error
            assert rows[rid].output_token_ids == expected[model].token_ids, model
        assert rows[ids[A]].model == A
    finally:
        client.close()
        service.stop()
