"""`inflight worker --tensor-parallel-size 2` end to end: requests topic -> a worker whose
model is sharded over two processes -> results -> recorder -> SQLite, rows equal to a
one-process engine's; then kill -9 of the worker (the leader) in the middle of a long
request leaves no rank behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from inflight.schemas import SamplingParams
from tests.consumers.conftest import Service, make_settings, tiny_engine, wait_rows
from tests.procs import alive, children, wait_gone

pytestmark = [pytest.mark.broker]

REPO = Path(__file__).resolve().parents[2]


def test_tp2_worker_serves_end_to_end_and_takes_its_rank_down_with_it(broker, tiny_model, tmp_path):
    from inflight.cli.commands import settings_env
    from inflight.engine import SamplingParams as EngineParams
    from inflight.producers.client import Client
    from inflight.store import Store

    url = f"sqlite:///{tmp_path / 'inflight.db'}"
    store = Store(url, create=True)
    settings = make_settings(broker, url)
    recorder = Service(settings, None, store, worker=False)
    client = Client(settings, store=store)
    env = {**os.environ, **settings_env(settings), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    log = tmp_path / "worker.log"
    worker = subprocess.Popen([sys.executable, "-m", "inflight", "worker", "--model", str(tiny_model),
                               "--tensor-parallel-size", "2", "--kv-cache-mb", "8"],
                              env=env, cwd=REPO, stdout=open(log, "ab"), stderr=subprocess.STDOUT)
    try:
        prompts = ["the quick brown fox", "hello world this is", "kafka carries prompts to workers",
                   "red green blue"]
        wire = [SamplingParams(max_tokens=8, temperature=0.0)] * 3 + \
               [SamplingParams(max_tokens=8, temperature=0.9, seed=11)]
        ids = [client.submit(p, w) for p, w in zip(prompts, wire)]
        rows = wait_rows(store, ids, timeout=120)
        assert all(rows[i].status == "completed" for i in ids), (rows, log.read_text()[-3000:])
        want = tiny_engine(tiny_model).generate(prompts, [
            EngineParams(max_tokens=8, temperature=w.temperature, seed=w.seed) for w in wire])
        assert [rows[i].output_token_ids for i in ids] == [w.token_ids for w in want]
        assert [rows[i].output for i in ids] == [w.text for w in want]

        ranks = children(worker.pid)
        assert len(ranks) == 1 and alive(ranks[0]), ranks
        assert b"worker_proc" in Path(f"/proc/{ranks[0]}/cmdline").read_bytes()
        long = [client.submit(f"one two three {w}", SamplingParams(max_tokens=500, ignore_eos=True))
                for w in ("red", "green", "blue", "pink")]
        deadline = time.monotonic() + 30
        while {r.status for r in store.get_requests(long).values()} != {"running"}:  # their status events
            assert time.monotonic() < deadline and worker.poll() is None, store.get_requests(long)
            time.sleep(0.05)
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
        assert wait_gone(ranks) == [], "the worker's tensor-parallel rank outlived it"
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        recorder.stop()
        client.close()
        store.close()
