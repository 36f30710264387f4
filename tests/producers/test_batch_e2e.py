"""Batch jobs end to end: the real embedded broker, a worker on a tiny model, the
recorder, and two Celery workers (`inflight jobs` processes, each with the sweep on its
own beat), on SQLite with the embedded (filesystem) Celery transport and on Postgres with
the real Redis.

One environment per backend serves every test of this module; each test makes its own
batch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import orjson
import pytest
from sqlalchemy import select

from inflight.store import FileRow, Store
from tests.consumers.conftest import Service, finals_of, make_settings, migrated, tiny_engine
from tests.kafka_read import read_topic
from tests.tiny_llama import SENTENCES

pytestmark = [pytest.mark.broker]

CHAT = "/v1/chat/completions"
REDIS_URL = os.environ.get("INFLIGHT_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture(scope="session")
def batch_model(tmp_path_factory) -> Path:
    from tests.tiny_llama import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama-batch"))


def _redis_or_skip() -> str:
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except Exception as e:  # noqa: BLE001 — any failure means "no Redis"
        if "required" in (os.environ.get("INFLIGHT_TEST_REDIS", ""),
                          os.environ.get("INFLIGHT_TEST_POSTGRES", "")):
            pytest.fail(f"Redis is required but {REDIS_URL} is unreachable: {e}", pytrace=False)
        pytest.skip(f"Redis not available at {REDIS_URL}: {e}")
    return REDIS_URL


STEP_S = 0.005  # a floor under each engine step: long requests outlast a 4 s window anywhere


def paced(engine, step_s: float):
    step = engine.step
    engine.step = lambda: (time.sleep(step_s), step())[1]
    return engine


class JobsProcess:
    """A real `inflight jobs` process (Celery worker; its own beat unless --no-beat)."""

    def __init__(self, settings, log: Path, *extra: str):
        from inflight.cli.commands import settings_env

        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "inflight", "jobs", "--concurrency", "2", *extra],
            env={**os.environ, **settings_env(settings)}, stdout=subprocess.DEVNULL,
            stderr=log.open("wb"))

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while b" jobs ready: " not in self.log.read_bytes():  # its start line
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            assert time.monotonic() < deadline, "inflight jobs did not start"
            time.sleep(0.1)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Env:
    """Worker + recorder (threads, tiny model) and two `inflight jobs` processes."""

    def __init__(self, settings, store, model, logs: Path):
        from inflight.producers.client import Client

        self.settings, self.store, self.logs = settings, store, logs
        # the jobs processes start (imports: seconds) while the worker joins its group
        self.jobs = [JobsProcess(settings, logs / f"jobs{i}.log") for i in range(2)]
        self.service = Service(settings, paced(tiny_engine(model), STEP_S), store)
        self.client = Client(settings, store=store)
        self.client.cancel(f"warmup-{uuid.uuid4().hex[:6]}")  # the worker's cancel reader goes live
        for j in self.jobs:
            j.wait_ready()

    def stop(self) -> None:
        for j in self.jobs:  # both shut down at once
            j.proc.send_signal(signal.SIGTERM)
        for j in self.jobs:
            j.stop()
        self.service.stop()
        self.client.close()


@pytest.fixture(scope="module", params=["sqlite+filesystem", "postgres+redis"])
def env(request, broker, batch_model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("batch-e2e")
    if request.param.startswith("sqlite"):
        url, celery_broker = f"sqlite:///{tmp / 'inflight.db'}", None
        store = Store(url, create=True)
    else:
        celery_broker = _redis_or_skip()
        url = migrated(request.getfixturevalue("postgres_url"))
        store = Store(url)
    settings = make_settings(broker, url, data_dir=tmp / "data", cache_dir=tmp / "cache",
                             model_path=str(batch_model), served_model_name="tiny-llama",
                             celery_broker=celery_broker,
                             celery_queue=f"q-{uuid.uuid4().hex[:8]}",
                             batch_sweep_interval_s=0.3, batch_lease_s=2.0,
                             batch_enqueue_chunk=20, metrics_interval_s=0.0)
    e = Env(settings, store, batch_model, tmp)
    try:
        yield e
    finally:
        e.stop()
        if celery_broker:
            import redis

            redis.Redis.from_url(celery_broker).delete(settings.celery_queue)
        store.close()


def _file(tmp_path, rows: list[dict]) -> Path:
    p = tmp_path / f"in-{uuid.uuid4().hex[:6]}.jsonl"
    p.write_bytes(b"\n".join(orjson.dumps(r) for r in rows) + b"\n")
    return p


def _line(cid: str, content: str, **body) -> dict:
    return {"custom_id": cid, "method": "POST", "url": CHAT,
            "body": {"model": "tiny-llama", "messages": [{"role": "user", "content": content}],
                     **body}}


def _reference(model, items):
    """Direct engine runs (a fresh engine): {custom_id: RequestOutput}."""
    from inflight.engine import SamplingParams as EP

    eng = tiny_engine(model)
    for cid, content, params in items:
        eng.add_request(cid, messages=[{"role": "user", "content": content}], params=EP(**params))
    return finals_of(eng)


def _files_of(store, batch_id) -> list[str]:
    with store.session() as s:
        return list(s.scalars(select(FileRow.id).where(FileRow.filename.startswith(batch_id))))


def test_batch_completes_and_matches_the_engine(env, batch_model, tmp_path):
    words = " ".join(SENTENCES).split()
    items = [(f"q{i}/{'é' if i % 3 == 0 else 'x'}", " ".join(words[i:i + 4 + i % 5]),
              {"max_tokens": 4 + i, "temperature": 0.0}) for i in range(7)]
    items.append(("seeded", "red green blue", {"max_tokens": 9, "temperature": 0.8, "seed": 7}))
    long_prompt = " ".join(["the quick brown fox jumps over the lazy dog"] * 80)  # > 512 tokens
    rows = [_line(cid, content, **p) for cid, content, p in items]
    rows.insert(3, _line("too-long", long_prompt, max_tokens=4))
    b = env.client.create_batch(_file(tmp_path, rows), metadata={"night": "1"})
    assert b.status == "validating" and b.meta == {"night": "1"}
    b = env.client.wait_batch(b.id, timeout=90, poll_s=0.1)
    assert b.status == "completed", b
    assert b.request_counts == {"total": 9, "completed": 8, "failed": 1}
    assert b.in_progress_at <= b.finalizing_at <= b.completed_at

    ref = _reference(batch_model, items)
    out = list(env.client.batch_results(b.id))
    assert [o["custom_id"] for o in out] == [cid for cid, _, _ in items]  # input order
    for o in out:
        want = ref[o["custom_id"]]
        body = o["response"]["body"]
        assert o["error"] is None and o["response"]["status_code"] == 200
        # the exact text, NULs too (store/models.ExactText: Postgres text cannot hold NUL)
        assert body["choices"][0]["message"]["content"] == want.text
        assert body["choices"][0]["finish_reason"] == want.finish_reason
        assert body["usage"]["completion_tokens"] == len(want.token_ids)
        assert body["model"] == "tiny-llama"
        row = env.store.get_request(o["response"]["request_id"])
        assert row.output_token_ids == want.token_ids and row.custom_id == o["custom_id"]
        assert row.prompt[0]["role"] == "user"  # filled in by the recorder
    (err,) = env.client.batch_results(b.id, errors=True)
    assert err["custom_id"] == "too-long" and err["response"]["status_code"] == 400
    assert err["response"]["body"]["error"]["code"] == "prompt_too_long"
    # two Celery workers swept it every 0.3 s: one finalization, one output + one error file
    assert sorted(_files_of(env.store, b.id)) == sorted([b.output_file_id, b.error_file_id])


def test_anthropic_batch_results_in_its_format(env, tmp_path):
    rows = [{"custom_id": f"m{i}", "params": {"model": "tiny-llama", "max_tokens": 3 + i,
             "system": "be brief", "messages": [{"role": "user", "content": SENTENCES[i]}]}}
            for i in range(3)]
    b = env.client.create_batch(_file(tmp_path, rows), endpoint="/v1/messages")
    b = env.client.wait_batch(b.id, timeout=60, poll_s=0.1)
    assert b.status == "completed" and b.error_file_id is None
    res = list(env.client.batch_results(b.id))
    assert [r["custom_id"] for r in res] == ["m0", "m1", "m2"]
    assert {r["result"]["type"] for r in res} == {"succeeded"}
    assert res[2]["result"]["message"]["usage"]["output_tokens"] <= 5


def test_cli_status_list_results_and_cancel(env, tmp_path, capsys, monkeypatch):
    from inflight.cli.main import main
    from inflight.cli.commands import settings_env

    for k, v in settings_env(env.settings).items():
        monkeypatch.setenv(k, v)
    rc = main(["batch", "create", str(_file(tmp_path, [_line(f"c{i}", "hi", max_tokens=2)
                                                       for i in range(3)])), "--json"])
    obj = orjson.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # create returns once every request is published (the tiny batch may be done already)
    assert rc == 0 and obj["status"] in ("in_progress", "finalizing", "completed")
    assert obj["x_progress"]["lines_enqueued"] == 3
    bid = obj["id"]
    assert main(["batch", "status", bid, "--wait", "--timeout", "60", "--json"]) == 0
    assert orjson.loads(capsys.readouterr().out)["status"] == "completed"
    assert main(["batch", "list", "--json"]) == 0
    assert bid in [orjson.loads(x)["id"] for x in capsys.readouterr().out.splitlines()]
    out, err = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    assert main(["batch", "results", bid, "-o", str(out), "--errors", str(err)]) == 0
    assert [orjson.loads(x)["custom_id"] for x in out.read_bytes().splitlines()] == ["c0", "c1", "c2"]
    assert err.read_bytes() == b""
    assert "3 output lines" in capsys.readouterr().err
    assert main(["batch", "cancel", bid]) == 2  # ended batches cannot be cancelled
    assert "is completed" in capsys.readouterr().err
    assert main(["batch", "status", "batch_nope"]) == 2


def test_bad_lines_fail_with_line_numbers_and_nothing_is_enqueued(env, tmp_path, capsys,
                                                                  monkeypatch):
    from inflight.cli.main import main
    from inflight.cli.commands import settings_env

    for k, v in settings_env(env.settings).items():
        monkeypatch.setenv(k, v)
    rows = [_line("a", "hello"), _line("b", "world", max_tokens=9999), _line("a", "again"),
            {**_line("c", "x"), "url": "/v1/completions"}]
    path = _file(tmp_path, rows)
    with path.open("ab") as f:
        f.write(b"{oops\n")
    rc = main(["batch", "create", str(path), "--json"])
    obj = orjson.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 1 and obj["status"] == "failed"
    errs = obj["errors"]["data"]
    assert [e["line"] for e in errs] == [2, 3, 4, 5]
    assert "context of 512" in errs[0]["message"] and "earlier line" in errs[1]["message"]
    assert env.store.list_batch(obj["id"]) == []
    published = read_topic(env.settings, env.settings.topic_requests_batch, n=10_000, timeout=1.5)
    assert not [r for r in published if r.key.decode().startswith(obj["id"])]
    rc = main(["batch", "status", obj["id"]])
    assert rc == 0 and "line 3: custom_id 'a' appears on an earlier line" in capsys.readouterr().out


def _wait(cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _long_and_short(n_short: int, n_long: int) -> list[dict]:
    short = [_line(f"s{i}", SENTENCES[i], max_tokens=2, temperature=0) for i in range(n_short)]
    long = [_line(f"l{i}", "hello", max_tokens=480, ignore_eos=True, temperature=0)
            for i in range(n_long)]
    return short + long


def _idle(env):
    w = env.service.worker
    _wait(lambda: not w.in_flight and w.engine.kv.pool.num_used_blocks == 0, 20,
          "the worker to finish or abort everything")


def test_cancel_mid_run_keeps_partial_results_and_frees_the_worker(env, tmp_path):
    b = env.client.create_batch(_file(tmp_path, _long_and_short(3, 30)))
    shorts = [f"{b.id}:s{i}" for i in range(3)]
    _wait(lambda: all(r.status == "completed" for r in env.store.get_requests(shorts).values())
          and len(env.store.get_requests(shorts)) == 3, 60, "the short requests")
    b = env.client.cancel_batch(b.id)
    assert b.status == "cancelling"
    b = env.client.wait_batch(b.id, timeout=60, poll_s=0.1)
    assert b.status == "cancelled" and b.request_completed >= 3 and b.request_cancelled >= 1
    _idle(env)
    out = list(env.client.batch_results(b.id))
    errs = list(env.client.batch_results(b.id, errors=True))
    assert {"s0", "s1", "s2"} <= {o["custom_id"] for o in out}
    assert len(out) + len(errs) == 33
    assert {e["error"]["code"] for e in errs} == {"batch_cancelled"}
    assert all(r.is_final for r in env.store.list_batch(b.id, limit=100))


def test_short_window_expires_with_batch_expired_lines(env, tmp_path):
    b = env.client.create_batch(_file(tmp_path, _long_and_short(2, 40)), completion_window="4s")
    b = env.client.wait_batch(b.id, timeout=60, poll_s=0.1)
    assert b.status == "expired" and b.expired_at is not None
    _idle(env)
    out = list(env.client.batch_results(b.id))
    errs = list(env.client.batch_results(b.id, errors=True))
    assert {"s0", "s1"} <= {o["custom_id"] for o in out}  # finished ones are kept
    assert errs and {e["error"]["code"] for e in errs} == {"batch_expired"}
    assert len(out) + len(errs) == 42 and b.request_expired == len(errs)
    assert {r.status for r in env.store.list_batch(b.id, limit=100)} <= {"completed", "expired"}


def test_enqueue_killed_midway_is_retried_without_running_a_request_twice(env, tmp_path):
    """A third `inflight jobs` process, alone on its queue, is killed (-9) while publishing;
    the sweep of the two others sends the enqueue task again once its lease lapsed.

    On the embedded transport only (to keep the suite's time): there a message taken by a
    killed worker is gone for good, so the sweep is the only way back. (Redis redelivers
    an unacknowledged task itself, after its visibility timeout; the resume logic is the
    same function, tested on both databases in test_batch_jobs.py.)"""
    if env.settings.celery_broker:
        pytest.skip("run on the embedded transport (see the docstring)")
    n = 200
    own = env.settings.model_copy(update={"celery_queue": f"kill-{uuid.uuid4().hex[:6]}",
                                          "batch_enqueue_chunk": 4})
    doomed = JobsProcess(own, tmp_path / "doomed.log", "--no-beat", "--pool", "solo")
    admitted = env.service.worker.metrics["admitted"]
    try:
        doomed.wait_ready()
        from inflight.producers.client import Client

        with Client(own, store=env.store) as sender:
            b = sender.create_batch(_file(tmp_path, [_line(f"k{i}", "one two", max_tokens=1)
                                                     for i in range(n)]))
            _wait(lambda: env.store.get_batch(b.id).lines_enqueued > 0, 60, "enqueue to start")
            doomed.stop(signal.SIGKILL)
    finally:
        doomed.stop(signal.SIGKILL)
    killed_at = env.store.get_batch(b.id).lines_enqueued
    assert 0 < killed_at < n, f"the kill missed the enqueue ({killed_at} of {n} published)"
    b = env.client.wait_batch(b.id, timeout=90, poll_s=0.2)
    assert b.status == "completed" and b.request_counts == {"total": n, "completed": n, "failed": 0}
    out = list(env.client.batch_results(b.id))
    assert sorted(o["custom_id"] for o in out) == sorted(f"k{i}" for i in range(n))
    assert len(env.store.list_batch(b.id, limit=1000)) == n
    assert env.service.worker.metrics["admitted"] - admitted == n  # each request ran once
    assert any(b"sending it again" in j.log.read_bytes() for j in env.jobs)
