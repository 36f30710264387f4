"""An upload a crash interrupts is reclaimed: kill -9 the API (`inflight api`, a process of
its own) while `POST /v1/files` writes its chunks, restart it, and after the grace period
the `uploading` row and its chunks are gone; a new upload works and stays."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select

from tests.api.server import free_port
from tests.consumers.conftest import make_settings, migrated

pytestmark = [pytest.mark.broker]

REPO = Path(__file__).resolve().parents[2]
GRACE_S = 3.0


class ApiProcess:
    def __init__(self, settings, log: Path):
        from inflight.cli.commands import settings_env

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, **settings_env(settings), "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen([sys.executable, "-m", "inflight", "api", "--port",
                                      str(self.port)], env=env, cwd=REPO,
                                     stdout=open(log, "ab"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise AssertionError(f"`inflight api` did not start:\n{log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _files(store) -> dict[str, tuple[str, int]]:
    """{file id: (status, stored chunks)} of every file row, `uploading` ones included."""
    from inflight.store.models import FileChunkRow, FileRow

    with store.session() as s:
        rows = s.execute(select(FileRow.id, FileRow.status)).all()
        chunks = dict(s.execute(select(FileChunkRow.file_id, func.count())
                                .group_by(FileChunkRow.file_id)).all())
    return {fid: (status, chunks.get(fid, 0)) for fid, status in rows} | {
        fid: ("(no row)", n) for fid, n in chunks.items() if fid not in {r[0] for r in rows}}


def _upload(url: str, key: str, body: bytes) -> httpx.Response:
    return httpx.post(url + "/v1/files", headers={"Authorization": f"Bearer {key}"},
                      files={"file": ("in.jsonl", body)}, data={"purpose": "batch"}, timeout=120)


def test_kill_9_mid_upload_then_the_sweep_reclaims_it(broker, db_url, tmp_path):
    from inflight.api.keys import create_key
    from inflight.store import Store

    url = migrated(db_url)
    settings = make_settings(broker, url, api_upload_grace_s=GRACE_S, metrics_interval_s=0.0,
                             api_max_upload_bytes=200_000_000, api_max_line_bytes=200_000,
                             data_dir=tmp_path / "data", cache_dir=tmp_path / "cache")
    store = Store(url)
    key = create_key(store, "uploader").token
    line = b'{"custom_id": "x", "body": {"messages": [{"role": "user", "content": "' + \
        b"y" * 100_000 + b'"}]}}\n'
    big = line * 800  # 80 MB: 80 chunks of 1 MiB, each its own transaction
    before = set(_files(store))
    api = ApiProcess(settings, tmp_path / "api.log")
    try:
        def upload_cut_short() -> None:
            with contextlib.suppress(httpx.HTTPError):  # the server dies under it
                _upload(api.url, key, big)

        threading.Thread(target=upload_cut_short, daemon=True).start()
        deadline, caught = time.monotonic() + 120, None
        while time.monotonic() < deadline and caught is None:
            for fid, (status, chunks) in _files(store).items():
                if fid not in before and status == "uploading" and chunks >= 2:
                    api.proc.kill()  # kill -9 while the chunks are going in
                    caught = fid
            time.sleep(0.02)
        assert caught is not None, "never saw the upload mid-write"
        api.proc.wait(10)
        status, chunks = _files(store)[caught]
        assert status == "uploading" and chunks >= 2  # what the crash left behind
    finally:
        api.stop()

    api = ApiProcess(settings, tmp_path / "api.log")  # the restart sweeps
    try:
        deadline = time.monotonic() + GRACE_S + 30
        while caught in _files(store) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert caught not in _files(store), _files(store)[caught]  # row and chunks gone
        ok = _upload(api.url, key, line * 3)
        assert ok.status_code == 200, ok.text
        fresh = ok.json()["id"]
        assert ok.json()["bytes"] == len(line) * 3 and _files(store)[fresh][0] == "uploaded"
        time.sleep(GRACE_S + 2)  # past the grace period and a sweep or two: kept
        assert _files(store)[fresh] == ("uploaded", 1)
        got = httpx.get(f"{api.url}/v1/files/{fresh}/content", timeout=30,
                        headers={"Authorization": f"Bearer {key}"})
        assert got.status_code == 200 and got.content == line * 3
    finally:
        api.stop()
        store.close()
    assert "reclaimed 1 upload(s)" in (tmp_path / "api.log").read_text()
