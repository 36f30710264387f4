"""LoRA adapters through the whole path (real broker, a worker serving a tiny model with
two adapters, the recorder, SQLite): /v1/models lists them with `parent`; the openai SDK
(`model="adapter-a"`) and the Kafka Client get each adapter's tokens, equal to the engine's
alone, in the same run as the base model's; an unknown adapter is model_not_found."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from inflight.engine import SamplingParams as EP
from inflight.api.keys import create_key
from tests.api.server import ApiServer
from tests.consumers.conftest import Service, finals_of, make_settings, migrated, tiny_engine, wait_rows
from tests.lora_adapters import write_peft_adapter

pytestmark = [pytest.mark.broker]

BASE, A, B, C = "tiny", "adapter-a", "adapter-b", "adapter-c"
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
            B: write_peft_adapter(tmp / "b", tiny_model, r=4, target_modules=["o_proj", "down_proj"], seed=2),
            C: write_peft_adapter(tmp / "c", tiny_model, r=2, target_modules=["gate_proj", "k_proj"], seed=3)}


@pytest.fixture(scope="module")
def expected(tiny_model, adapters):
    eng = lora_engine(tiny_model, adapters)
    for model in (None, A, B, C):
        eng.add_request(str(model), prompt_token_ids=PROMPT, lora=model,
                        params=EP(max_tokens=8, temperature=0.0, ignore_eos=True))
    return {None if k == "None" else k: o for k, o in finals_of(eng).items()}


def test_adapters_over_kafka_and_the_openai_sdk(broker, tiny_model, adapters, expected, tmp_path):
    from inflight.producers.client import Client
    from inflight.schemas import SamplingParams
    from inflight.store import Store

    url = migrated(f"sqlite:///{tmp_path / 'db.sqlite'}")
    settings = make_settings(broker, url, default_model=BASE, served_model_name=BASE,
                             registry_heartbeat_s=0.3, registry_ttl_s=3.0, api_key_cache_s=0.0,
                             api_wait_timeout_s=60.0, data_dir=tmp_path / "data",
                             cache_dir=tmp_path / "cache")
    assert len({tuple(o.token_ids) for o in expected.values()}) == 4  # each adapter changes the tokens
    settings = settings.updated(api_lora_admins=["ops"])
    store = Store(url)
    # A and B from the start (--lora), C loaded at run time
    service = Service(settings, lora_engine(tiny_model, {A: adapters[A], B: adapters[B]}), store)
    client = Client(settings, store=store)
    try:
        with ApiServer(settings) as api:
            key = create_key(api.ctx.store, "test", owner="ops")
            other = create_key(api.ctx.store, "someone")
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
            denied = httpx.post(api.url + "/v1/load_lora_adapter", json={"lora_name": C, "lora_path": "/x"},
                                headers={"Authorization": f"Bearer {other.token}"})
            assert denied.status_code == 403 and "INFLIGHT_API_LORA_ADMINS" in denied.text

        params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
        ids = {model: client.submit(PROMPT, params, model=model) for model in (B, A, None)}
        rows = wait_rows(store, list(ids.values()))
        for model, rid in ids.items():
            assert rows[rid].status == "completed", rows[rid].error
            assert rows[rid].output_token_ids == expected[model].token_ids, model
        assert rows[ids[A]].model == A
        # an adapter's request that ends before it runs (past its deadline when read) is
        # recorded under the adapter's name too, not the base model's
        late = client.submit(PROMPT, params, model=A, deadline=time.time() + 0.001)
        row = wait_rows(store, [late])[late]
        assert row.status == "expired" and row.model == A, (row.status, row.model)
        run_time_load_and_unload(settings, client, store, adapters[C], expected, key)
        registry = service.worker.metrics.registry
        deadline = time.monotonic() + 10
        while (registry.get_sample_value("inflight_lora_loads_total", {"model_name": BASE}) or 0) < 3 \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        assert registry.get_sample_value("inflight_lora_loads_total", {"model_name": BASE}) >= 3
        assert registry.get_sample_value("inflight_lora_load_seconds_count", {"model_name": BASE}) >= 3
        info = [s for m in registry.collect() if m.name == "vllm:lora_requests_info" for s in m.samples]
        assert info and info[0].labels["max_lora"] == "2"
    finally:
        client.close()
        service.stop()


def listed_models(sdk, want: set[str], present: bool, timeout: float = 20.0) -> set[str]:
    deadline = time.monotonic() + timeout
    while True:
        got = {m.id for m in sdk.models.list().data}
        if (want <= got) == present and (present or not want & got) or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def run_time_load_and_unload(settings, client, store, path_c, expected, key):
    """POST /v1/load_lora_adapter while requests run: C appears with its parent and answers
    with its tokens; the base model's requests in flight meanwhile complete unchanged;
    unloading takes it off (then model_not_found)."""
    from inflight.schemas import SamplingParams

    with ApiServer(settings) as api:
        sdk = openai.OpenAI(base_url=api.url + "/v1", api_key=key.token, max_retries=0, timeout=60)
        auth = {"Authorization": f"Bearer {key.token}"}
        params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
        running = [client.submit(PROMPT, params, model=m) for m in (None, A, None, B)]
        r = httpx.post(api.url + "/v1/load_lora_adapter", json={"lora_name": C, "lora_path": str(path_c)},
                       headers=auth, timeout=30)
        assert r.status_code == 200 and "added successfully" in r.text
        assert C in listed_models(sdk, {C}, True)
        assert sdk.models.retrieve(C).parent == BASE
        done = sdk.completions.create(model=C, prompt=PROMPT, max_tokens=8, temperature=0,
                                      extra_body={"ignore_eos": True})
        assert done.choices[0].text == expected[C].text
        rows = wait_rows(store, running)
        assert [rows[i].output_token_ids for i in running] == [
            expected[m].token_ids for m in (None, A, None, B)]
        r = httpx.post(api.url + "/v1/unload_lora_adapter", json={"lora_name": C}, headers=auth, timeout=30)
        assert r.status_code == 200
        assert C not in listed_models(sdk, {C}, False)
        with pytest.raises(openai.NotFoundError):
            sdk.completions.create(model=C, prompt=PROMPT, max_tokens=2)
