"""The real API under uvicorn on a free port, in a thread of the test process."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

from inflight.api import create_app
from inflight.schemas import Settings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ApiServer:
    """`with ApiServer(settings) as api: httpx.get(api.url + "/healthz")`"""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.app = create_app(settings)
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port,
                                                    log_level="warning", access_log=False))
        self.thread = threading.Thread(target=self.server.run, name="api", daemon=True)

    def __enter__(self) -> "ApiServer":
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the API server did not start (see the log above)")
            time.sleep(0.02)
        return self

    @property
    def ctx(self):
        return self.app.state.ctx

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "the API server did not stop"
