"""A sampled stream survives a worker crash: the request's seed is fixed at submit (from its
id), so the redo on another worker samples the same tokens and the stream goes on where it
broke, as the API's streams send it (api/follow.SentText), without "redone ... different
text". Real broker, worker processes killed with SIGKILL, Postgres."""

from __future__ import annotations

import signal
import sys
import threading
import time

import pytest

from inflight.api.follow import SentText
from inflight.engine.sampling_params import seed_for
from inflight.schemas import FinalEvent, SamplingParams, TokenEvent
from tests.consumers.conftest import Service, make_settings, migrated, wait_rows
from tests.consumers.test_faults import REPO, _worker_process

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.postgres]


def _slow_worker(settings, model, log, step_ms: int):
    import os
    import subprocess

    from inflight.cli.commands import settings_env

    env = {**os.environ, **settings_env(settings), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "tests.consumers.slow_worker", "--model",
                             str(model), "--step-ms", str(step_ms)],
                            env=env, cwd=REPO, stdout=open(log, "ab"), stderr=subprocess.STDOUT)


def test_sampled_stream_continues_on_the_redo_after_kill9(broker, tiny_model, postgres_url,
                                                          tmp_path):
    from inflight.producers.client import Client
    from inflight.store import Store

    url = migrated(postgres_url)
    settings = make_settings(broker, url, worker_max_inflight=4)
    store = Store(url)
    recorder = Service(settings, None, store, worker=False)
    client = Client(settings, store=store)
    log = tmp_path / "worker.log"
    rid = client.submit("one two three red", SamplingParams(max_tokens=300, temperature=1.0,
                                                            top_k=50, ignore_eos=True))

    sent, got = SentText(), {"tokens": 0, "restarts": 0, "diverged": 0, "final": None}

    def follow():
        for ev in client.stream(rid, timeout=240):
            if isinstance(ev, TokenEvent):
                got["restarts"] += ev.index == 0 and got["tokens"] > 0
                got["tokens"] += len(ev.token_ids)
                got["diverged"] += sent.feed(ev) is None
            else:
                got["final"] = ev

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    first = _slow_worker(settings, tiny_model, log, step_ms=25)
    second = None
    try:
        deadline = time.monotonic() + 90
        while got["tokens"] < 30:  # mid-stream
            assert time.monotonic() < deadline and first.poll() is None, log.read_text()[-3000:]
            time.sleep(0.05)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        assert got["final"] is None, "the request finished before the kill; nothing proven"
        second = _worker_process(settings, tiny_model, log)
        reader.join(timeout=200)
        assert not reader.is_alive(), log.read_text()[-3000:]
        final = got["final"]
        assert isinstance(final, FinalEvent), final
        assert got["restarts"] >= 1            # the redo's deltas started over (index 0) ...
        assert got["diverged"] == 0            # ... with the same text: the stream went on
        row = wait_rows(store, [rid], timeout=60)[rid]
        assert sent.sent == final.text == row.output
        assert row.output_token_ids == final.token_ids and len(final.token_ids) == 300
        assert row.params["seed"] == seed_for(rid)  # fixed at submit, recorded with it
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
        recorder.stop()
        client.close()
        store.close()
