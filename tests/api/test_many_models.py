"""Two models behind one API, through the official SDKs (real broker, two tiny models on two
workers, the recorder, a Celery jobs process, SQLite and Postgres):

- /v1/models lists both (their context lengths; the default first) and follows their workers;
- chat and text completions, /v1/requests and the Messages API answer on the model named,
  token for token as that model's engine alone;
- an OpenAI batch file that mixes models line by line completes, each line on its model;
  a line naming a model nobody serves fails the batch naming the line and the model;
- an unknown model is refused on every path (404 model_not_found; 400 for a message batch).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import anthropic
import httpx
import openai
import orjson
import pytest

from inflight.schemas import Settings
from tests.api.conftest import _database
from tests.api.server import ApiServer
from tests.api.test_batches import jsonl, wait_batch
from tests.consumers.conftest import Service, make_settings, tiny_engine

pytestmark = [pytest.mark.broker]

A, B = "tiny-a", "tiny-b"
PROMPT = [5, 17, 42, 9, 100]


@dataclass
class TwoModels:
    settings: Settings
    api: ApiServer
    services: dict[str, Service]
    folders: dict[str, Path]

    def key(self):
        from inflight.api.keys import create_key

        return create_key(self.api.ctx.store, "test")

    def openai(self, key) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.api.url + "/v1", api_key=key.token, max_retries=0,
                             timeout=60)

    def anthropic(self, key) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.api.url, api_key=key.token, max_retries=0,
                                   timeout=60)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def two(request, broker, tiny_model, tiny_model_b, tmp_path_factory):
    from tests.producers.test_batch_e2e import JobsProcess, _redis_or_skip

    tmp = tmp_path_factory.mktemp("two-models")
    celery_broker = None if request.param == "sqlite" else _redis_or_skip()
    with _database(request, tmp_path_factory) as database:
        sa = make_settings(broker, database, default_model=A, served_model_name=A,
                           registry_heartbeat_s=0.3, registry_ttl_s=3.0, api_key_cache_s=0.0,
                           api_wait_timeout_s=60.0, data_dir=tmp / "data", cache_dir=tmp / "cache",
                           celery_broker=celery_broker, celery_queue=f"q-{uuid.uuid4().hex[:8]}",
                           batch_sweep_interval_s=0.3, batch_lease_s=2.0)
        sb = sa.updated(served_model_name=B)
        jobs = JobsProcess(sa, tmp / "jobs.log")
        services = {A: Service(sa, tiny_engine(tiny_model)),
                    B: Service(sb, tiny_engine(tiny_model_b), recorder=False)}
        try:
            jobs.wait_ready()
            with ApiServer(sa) as api:
                yield TwoModels(sa, api, services, {A: tiny_model, B: tiny_model_b})
        finally:
            jobs.stop()
            for s in services.values():
                s.stop()


def listed(client: openai.OpenAI, want: set[str], timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        got = {m.id: m for m in client.models.list().data}
        if set(got) == want or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def engine_text(folder: Path, prompt, max_tokens: int, messages=None,
                ignore_eos: bool = True) -> tuple[str, list[int]]:
    from inflight.engine import SamplingParams as EP
    from tests.consumers.conftest import finals_of

    eng = tiny_engine(folder)
    eng.add_request("r", prompt_token_ids=prompt, messages=messages,
                    params=EP(max_tokens=max_tokens, temperature=0.0, ignore_eos=ignore_eos))
    out = finals_of(eng)["r"]
    return out.text, out.token_ids


def test_models_are_listed_and_each_answers_on_its_own_weights(two):
    key = two.key()
    client = two.openai(key)
    models = listed(client, {A, B})
    assert [m.id for m in client.models.list().data] == [A, B]  # the default first
    assert (models[A].max_model_len, models[B].max_model_len) == (512, 256)
    assert models[B].parent is None and client.models.retrieve(B).id == B
    assert client.models.retrieve("default").id == A
    for model in (A, B):
        text, ids = engine_text(two.folders[model], PROMPT, 8)
        done = client.completions.create(model=model, prompt=PROMPT, max_tokens=8,
                                         temperature=0, extra_body={"ignore_eos": True})
        assert done.model == model and done.choices[0].text == text
        chat = [{"role": "user", "content": "hello there"}]
        want, _ = engine_text(two.folders[model], None, 6, messages=chat)
        got = client.chat.completions.create(model=model, messages=chat, max_tokens=6,
                                             temperature=0, extra_body={"ignore_eos": True})
        assert got.model == model and got.choices[0].message.content == want
        msg = two.anthropic(key).messages.create(model=model, max_tokens=6, messages=chat,
                                                 extra_body={"temperature": 0})
        said, _ = engine_text(two.folders[model], None, 6, messages=chat, ignore_eos=False)
        assert msg.model == model and "".join(b.text for b in msg.content) == said
        with httpx.Client(base_url=two.api.url, timeout=60,
                          headers={"Authorization": f"Bearer {key.token}"}) as http:
            made = http.post("/v1/requests", json={
                "model": model, "prompt_token_ids": PROMPT,
                "params": {"max_tokens": 8, "temperature": 0, "ignore_eos": True}})
            assert made.status_code == 202 and made.json()["model"] == model
            rid = made.json()["id"]
            deadline = time.monotonic() + 60
            while (row := http.get(f"/v1/requests/{rid}").json())["status"] != "completed":
                assert time.monotonic() < deadline, row
                time.sleep(0.1)
            assert row["token_ids"] == ids and row["model"] == model


def test_an_unknown_model_is_refused_on_every_path(two):
    key = two.key()
    client = two.openai(key)
    chat = [{"role": "user", "content": "hi"}]
    for call in (lambda: client.chat.completions.create(model="tiny-c", messages=chat),
                 lambda: client.completions.create(model="tiny-c", prompt="hi"),
                 lambda: client.models.retrieve("tiny-c")):
        with pytest.raises(openai.NotFoundError) as err:
            call()
        assert err.value.code == "model_not_found" and "tiny-c" in err.value.message
    ant = two.anthropic(key)
    for call in (lambda: ant.messages.create(model="tiny-c", max_tokens=4, messages=chat),
                 lambda: ant.messages.count_tokens(model="tiny-c", messages=chat)):
        with pytest.raises(anthropic.NotFoundError) as err:
            call()
        assert "tiny-c" in str(err.value)
    with pytest.raises(anthropic.BadRequestError) as err:
        ant.messages.batches.create(requests=[{"custom_id": "a", "params": {
            "model": "tiny-c", "max_tokens": 4, "messages": chat}}])
    assert err.value.body["error"]["message"].startswith("requests.0: params.model")
    with httpx.Client(base_url=two.api.url, timeout=60,
                      headers={"Authorization": f"Bearer {key.token}"}) as http:
        resp = http.post("/v1/requests", json={"model": "tiny-c", "prompt": "hi"})
        assert resp.status_code == 404 and resp.json()["error"]["code"] == "model_not_found"
    # a batch file: the line and the model are named; nothing of the file runs
    rows = [{"custom_id": f"ok{i}", "method": "POST", "url": "/v1/completions",
             "body": {"model": A, "prompt": "x", "max_tokens": 2}} for i in range(2)]
    rows.insert(1, {"custom_id": "bad", "method": "POST", "url": "/v1/completions",
                    "body": {"model": "tiny-c", "prompt": "x", "max_tokens": 2}})
    upload = client.files.create(file=("bad.jsonl", jsonl(rows)), purpose="batch")
    batch = wait_batch(client, client.batches.create(
        input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h").id)
    assert batch.status == "failed"
    (error,) = batch.errors.data
    assert (error.line, error.param, error.code) == (2, "body.model", "model_not_found")
    assert "'tiny-c'" in error.message and error.message.startswith("line 2: ")


def test_a_batch_file_that_mixes_models_completes_each_line_on_its_model(two):
    key = two.key()
    client = two.openai(key)
    listed(client, {A, B})
    items = [(f"q{i}", [A, B, None, "default"][i % 4], [3 + i, 40 + i, 7], 4 + i % 3)
             for i in range(8)]
    rows = [{"custom_id": cid, "method": "POST", "url": "/v1/completions",
             "body": {**({"model": m} if m else {}), "prompt": p, "max_tokens": n,
                      "temperature": 0, "ignore_eos": True}} for cid, m, p, n in items]
    upload = client.files.create(file=("mixed.jsonl", jsonl(rows)), purpose="batch")
    batch = wait_batch(client, client.batches.create(
        input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h").id, 120)
    assert batch.status == "completed", batch.errors
    assert batch.request_counts.completed == len(items)
    out = {o["custom_id"]: o for o in map(orjson.loads,
                                          client.files.content(batch.output_file_id).text.splitlines())}
    store = two.api.ctx.store
    for cid, m, prompt, n in items:
        model = B if m == B else A
        text, ids = engine_text(two.folders[model], prompt, n)
        body = out[cid]["response"]["body"]
        assert body["choices"][0]["text"] == text, (cid, model)
        assert store.get_request(out[cid]["response"]["request_id"]).model == model


def test_models_follow_their_workers(two):
    """Last: it stops B's worker. A graceful stop takes B off at once; A keeps answering."""
    key = two.key()
    client = two.openai(key)
    assert set(listed(client, {A, B})) == {A, B}
    two.services[B].stop()
    assert set(listed(client, {A}, timeout=10)) == {A}
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model=B, prompt=PROMPT, max_tokens=2)
    done = client.completions.create(model=A, prompt=PROMPT, max_tokens=2, temperature=0)
    assert done.model == A
