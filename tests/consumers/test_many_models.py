"""Two models behind one queue, on the real path (embedded broker, real engines on two
different tiny models, the recorder, SQLite and Postgres):

- each model's requests land on its own weights (tokens equal to that model's engine
  alone), on its own topics, in its own group; results, DLQ and cancel topics are shared;
- the registry lists both with their limits, and follows workers stopping (a tombstone at
  once, a killed one after the TTL) and starting;
- a message written to the wrong model's topic ends `model_not_found` (and its raw copy goes
  to the DLQ), never runs; an unknown model is a typed error at Client.submit, unless the
  caller submits it anyway for workers that start later;
- kill -9 of one model's worker: the other model's requests are untouched (one attempt
  each), its own are redone exactly once (one final row each, the same tokens).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from inflight.schemas import InferenceRequest, SamplingParams, encode
from inflight.schemas.errors import ModelNotFoundError
from inflight.transport.model_topics import ModelTopics
from tests.consumers.conftest import (Service, make_settings, migrated, read_topic, tiny_engine,
                                      wait_rows)

pytestmark = [pytest.mark.broker]

REPO = Path(__file__).resolve().parents[2]
A, B = "tiny-a", "tiny-b"


def two_models(broker, url, **kw):
    """Settings of model A (the default: today's topics) and model B (its own), one
    deployment: the same topics, INFLIGHT_DEFAULT_MODEL naming A."""
    a = make_settings(broker, url, default_model=A, served_model_name=A,
                      registry_heartbeat_s=0.3, registry_ttl_s=3.0, **kw)
    return a, a.updated(served_model_name=B)


def prompts(n: int, seed: int) -> list[list[int]]:
    return [[3 + (seed * 7 + i * 13 + j * 5) % 290 for j in range(4 + i % 5)] for i in range(n)]


def expected(model: Path, ids: list[list[int]], params) -> list[list[int]]:
    from inflight.engine import SamplingParams as EngineParams

    engine = tiny_engine(model)
    out = engine.generate(ids, [EngineParams(**params.to_dict())] * len(ids))
    return [o.token_ids for o in out]


def wait_models(client, want: set[str], timeout: float = 20.0) -> set[str]:
    deadline = time.monotonic() + timeout
    while True:
        got = {m.id for m in client.models()}
        if got == want or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


def test_two_models_each_request_on_its_own_weights(broker, tiny_model, tiny_model_b, db_url):
    from inflight.producers.client import Client
    from inflight.store import Store

    url = migrated(db_url)
    sa, sb = two_models(broker, url)
    store = Store(url)
    svc_a = Service(sa, tiny_engine(tiny_model), store)                 # worker A + recorder
    svc_b = Service(sb, tiny_engine(tiny_model_b), store, recorder=False)
    client = Client(sa, store=store)
    try:
        assert wait_models(client, {A, B}) == {A, B}
        listed = {m.id: m for m in client.models()}
        assert listed[A].default and not listed[B].default
        assert (listed[A].max_model_len, listed[B].max_model_len) == (512, 256)
        assert listed[B].topics.requests == ModelTopics.named(sa, B).requests
        assert listed[B].topics.group != listed[A].topics.group

        params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
        pa, pb = prompts(6, 1), prompts(6, 2)
        ids_a = [client.submit(p, params) for p in pa[:3]]                 # no model: the default
        ids_a += [client.submit(p, params, model=A) for p in pa[3:]]       # by its name
        ids_b = [client.submit(p, params, model=B) for p in pb]
        ids_b += client.submit_many([{"prompt_token_ids": pb[0], "model": B}], params)
        rows = wait_rows(store, ids_a + ids_b)
        assert {r.status for r in rows.values()} == {"completed"}
        want_a, want_b = expected(tiny_model, pa, params), expected(tiny_model_b, pb, params)
        assert [rows[i].output_token_ids for i in ids_a] == want_a
        assert [rows[i].output_token_ids for i in ids_b] == want_b + want_b[:1]
        assert want_a[0] != want_b[0] or pa[0] != pb[0]
        assert {rows[i].model for i in ids_a} == {A} and {rows[i].model for i in ids_b} == {B}
        assert {rows[i].worker for i in ids_a} == {svc_a.worker.name}
        assert client.result(ids_b[0]).model == B
        # B's requests travelled on B's topic, A's on today's
        on_b = {r.key.decode() for r in read_topic(sa, listed[B].topics.requests)}
        assert set(ids_b) <= on_b and not set(ids_a) & on_b

        # a producer that writes to the wrong topic: model_not_found, never run, DLQ copy
        wrong = [InferenceRequest(request_id="misrouted-b", model=B, prompt_token_ids=pb[0]),
                 InferenceRequest(request_id="misrouted-none", prompt_token_ids=pa[0])]
        client.producer.send(sa.topic_requests, key=b"misrouted-b", value=encode(wrong[0]))
        client.producer.send(listed[B].topics.requests, key=b"misrouted-none",
                             value=encode(wrong[1]))
        client.flush()
        rows = wait_rows(store, ["misrouted-b", "misrouted-none"])
        for rid, model in (("misrouted-b", B), ("misrouted-none", None)):
            row = rows[rid]
            assert (row.status, row.error_code) == ("failed", "model_not_found"), row.error
            assert row.output_token_ids is None and "did not run" in row.error
            assert row.model == model
        dlq = {r.key: r for r in read_topic(sa, sa.topic_dlq)}
        assert orjson.loads(dlq[b"misrouted-b"].value)["model"] == B

        # an unknown model: a typed error, nothing sent; or sent anyway to its own topic
        with pytest.raises(ModelNotFoundError) as err:
            client.submit("hi", model="tiny-c")
        assert err.value.model == "tiny-c" and set(err.value.served) == {A, B}
        assert "tiny-a" in str(err.value) and "allow_unserved" in str(err.value)
        rid = client.submit("hi", model="tiny-c", allow_unserved=True)
        waiting = read_topic(sa, ModelTopics.named(sa, "tiny-c").requests,
                             until=lambda recs: recs, timeout=10)
        assert [r.key.decode() for r in waiting] == [rid]  # the topic the producer made

        # B stops gracefully: off the registry at once; A's requests go on
        svc_b.stop()
        assert wait_models(client, {A}, timeout=5) == {A}
        late = client.submit(pa[0], params)
        assert wait_rows(store, [late])[late].output_token_ids == want_a[0]
    finally:
        client.close()
        svc_b.stop()
        svc_a.stop()


def test_which_model_is_the_default_when_none_is_named(broker, tiny_model, tiny_model_b,
                                                        tmp_path):
    """INFLIGHT_DEFAULT_MODEL unset: the first model up keeps today's topics, a second
    model's worker reads its own (it sees the first live on the registry); the same model
    again scales out on the default's. Set, but not agreeing with the live workers: the
    worker refuses to start rather than read another model's topic."""
    from inflight.consumers.worker import Worker
    from inflight.schemas.errors import ConfigError

    s = make_settings(broker, f"sqlite:///{tmp_path / 'db'}", served_model_name=A)
    first = Worker(s, tiny_engine(tiny_model)).open()
    try:
        assert first.serving.default and first.serving.topics.requests == s.topic_requests
        second = Worker(s.updated(served_model_name=B), tiny_engine(tiny_model_b)).open()
        try:
            assert not second.serving.default
            assert second.serving.topics == ModelTopics.named(s, B)
            assert second.intake.topics == second.serving.topics
        finally:
            second.close()
        again = Worker(s, tiny_engine(tiny_model)).open()  # scale-out of the default
        assert again.serving.default
        again.close()
        wrong = Worker(s.updated(served_model_name=B, default_model=B), tiny_engine(tiny_model_b))
        with pytest.raises(ConfigError, match="INFLIGHT_DEFAULT_MODEL") as err:
            wrong.open()
        assert A in str(err.value) and s.topic_requests in str(err.value)
    finally:
        first.close()


class WorkerProcess:
    """`inflight worker --model FOLDER --served-model-name NAME` with the test's settings."""

    def __init__(self, settings, model: Path, name: str, log: Path):
        from inflight.cli.commands import settings_env

        env = {**os.environ, **settings_env(settings), "OMP_NUM_THREADS": "1",
               "PYTHONPATH": str(REPO)}
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "inflight", "worker", "--model", str(model),
             "--served-model-name", name], env=env, cwd=REPO, stdout=open(log, "ab"),
            stderr=subprocess.STDOUT)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.mark.slow
def test_kill9_of_one_models_worker_leaves_the_other_untouched(broker, tiny_model, tiny_model_b,
                                                               db_url, tmp_path):
    """N workers of B, one of A; A's worker is killed mid-run: B's requests all end with one
    attempt, A's are redone by a new worker exactly once, tokens unchanged."""
    from inflight.producers.client import Client
    from inflight.store import Store

    url = migrated(db_url)
    sa, sb = two_models(broker, url, partitions=2, worker_max_inflight=4)
    store = Store(url)
    recorder = Service(sa, None, store, worker=False)
    client = Client(sa, store=store)
    # long runs (each model's context nearly full), so that the kill finds some running
    params_a = SamplingParams(max_tokens=480, temperature=0.0, ignore_eos=True)
    params = SamplingParams(max_tokens=240, temperature=0.0, ignore_eos=True)
    pa, pb = prompts(12, 3), prompts(8, 4)
    procs = [WorkerProcess(sb, tiny_model_b, B, tmp_path / f"b{i}.log") for i in range(2)]
    first_a = WorkerProcess(sa, tiny_model, A, tmp_path / "a1.log")
    procs.append(first_a)
    try:
        assert wait_models(client, {A, B}, timeout=90) == {A, B}, (tmp_path / "a1.log").read_text()
        deadline = time.monotonic() + 90
        while len(next(m for m in client.models() if m.id == B).workers) < 2:  # scale-out
            assert time.monotonic() < deadline, (tmp_path / "b1.log").read_text()[-3000:]
            time.sleep(0.2)
        ids_a = client.submit_many(pa, params_a)
        ids_b = client.submit_many(pb, params, model=B)
        deadline = time.monotonic() + 300
        while True:  # some of A's finished, others running: kill its worker then
            states = [r.status for r in store.get_requests(ids_a).values()]
            if "completed" in states and "running" in states:
                break
            assert time.monotonic() < deadline and first_a.proc.poll() is None, \
                (states, (tmp_path / "a1.log").read_text()[-3000:])
            time.sleep(0.02)
        first_a.kill()
        rows = store.get_requests(ids_a)
        unfinished = [i for i in ids_a if i not in rows or rows[i].status != "completed"]
        running = {i for i in unfinished if i in rows and rows[i].status == "running"}
        assert running, "nothing of A's was running at the kill; the test proves nothing"

        # B goes on untouched: every request once, while A has no worker
        rows_b = wait_rows(store, ids_b, timeout=180)
        assert {r.status for r in rows_b.values()} == {"completed"}
        assert {r.attempts for r in rows_b.values()} == {1}
        assert [rows_b[i].output_token_ids for i in ids_b] == expected(tiny_model_b, pb, params)
        assert not any(r.status == "completed" for r in store.get_requests(unfinished).values())
        assert wait_models(client, {B}, timeout=15) == {B}  # the killed worker drops off

        procs.append(WorkerProcess(sa, tiny_model, A, tmp_path / "a2.log"))
        rows_a = wait_rows(store, ids_a, timeout=180)
        assert {r.status for r in rows_a.values()} == {"completed"}
        assert [rows_a[i].output_token_ids for i in ids_a] == expected(tiny_model, pa, params_a)
        assert {rows_a[i].attempts for i in running} == {2}  # redone exactly once
        assert {r.model for r in rows_a.values()} == {A}
        assert wait_models(client, {A, B}) == {A, B}
    finally:
        client.close()
        for p in procs:
            p.stop()
        recorder.stop()
