"""Where the embedded broker keeps its log: memory (the default: nothing survives a restart)
or an S3 bucket (Tansu's `s3://` storage engine), which keeps topics, records and committed
offsets across restarts of the broker.

    S3Storage("tansu", endpoint="http://127.0.0.1:9000", key_id=..., secret=...)
    LocalS3(port)   a local S3-compatible server (moto's server mode) for tests and demos

Tansu reads the S3 connection from AWS_* environment variables; S3Storage.env() sets them
for the broker process only.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from inflight.schemas.errors import BrokerError


@dataclass(frozen=True)
class S3Storage:
    bucket: str
    endpoint: str | None = None            # None: AWS itself
    key_id: str = "test"
    secret: str = "test"
    region: str = "us-east-1"

    def engine_url(self) -> str:
        return f"s3://{self.bucket}/"

    def env(self) -> dict[str, str]:
        env = {"AWS_ACCESS_KEY_ID": self.key_id, "AWS_SECRET_ACCESS_KEY": self.secret,
               "AWS_DEFAULT_REGION": self.region}
        if self.endpoint:
            env["AWS_ENDPOINT"] = self.endpoint
            env["AWS_ALLOW_HTTP"] = str(self.endpoint.startswith("http://")).lower()
        return env


class LocalS3:
    """moto's S3 server on 127.0.0.1 (`pip install "moto[server]"`), with one bucket. Its
    objects live in its memory: they outlive broker restarts, not this server's."""

    def __init__(self, port: int, bucket: str = "tansu", log_path: str | Path | None = None):
        self.port = port
        self.bucket = bucket
        self.log_path = Path(log_path) if log_path else None
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def storage(self) -> S3Storage:
        return S3Storage(self.bucket, endpoint=self.endpoint)

    def start(self, timeout: float = 30.0) -> "LocalS3":
        exe = shutil.which("moto_server") or str(Path(sys.executable).with_name("moto_server"))
        if not Path(exe).exists():
            raise BrokerError("a local S3 server needs moto's server mode: "
                              'pip install "moto[server]"')
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(self.port)], stdout=out,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise BrokerError(f"the local S3 server did not start on port {self.port}")
                time.sleep(0.1)
        req = urllib.request.Request(f"{self.endpoint}/{self.bucket}", method="PUT")
        urllib.request.urlopen(req, timeout=10).close()
        return self

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def __enter__(self) -> "LocalS3":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
