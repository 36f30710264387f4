"""Counters for the worker and the recorder: a periodic one-line summary and an optional
Prometheus text endpoint (`GET /metrics`).

Counters only go up; gauges are set. Both are plain ints read by the HTTP thread without
locks (a torn read of an int cannot happen in CPython).
"""

from __future__ import annotations

import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger("inflight.metrics")

COUNTERS = ("received", "admitted", "completed", "failed", "cancelled", "dlq", "duplicates",
            "tokens_out", "commits", "rows_written", "db_retries")
# the worker's delivery path (issue 10)
COUNTERS += ("token_events", "send_retries", "send_errors", "handed_back", "rebalances")
GAUGES = ("in_flight", "paused_partitions", "commit_lag")


class Metrics:
    def __init__(self, component: str, interval_s: float = 10.0):
        self.component = component
        self.values: dict[str, float] = dict.fromkeys(COUNTERS + GAUGES, 0)
        self.interval_s = interval_s
        self._last_summary = time.monotonic()
        self._server: ThreadingHTTPServer | None = None

    def inc(self, name: str, n: float = 1) -> None:
        self.values[name] += n

    def set(self, name: str, value: float) -> None:
        self.values[name] = value

    def __getitem__(self, name: str) -> float:
        return self.values[name]

    def summary(self) -> str:
        v = self.values
        return (f"{self.component}: received={v['received']} admitted={v['admitted']} "
                f"completed={v['completed']} failed={v['failed']} cancelled={v['cancelled']} "
                f"dlq={v['dlq']} dup={v['duplicates']} in_flight={v['in_flight']} "
                f"paused={v['paused_partitions']} tokens_out={v['tokens_out']} "
                f"rows={v['rows_written']} db_retries={v['db_retries']} "
                f"commit_lag={v['commit_lag']}")

    def maybe_log(self) -> None:
        if self.interval_s <= 0:
            return
        now = time.monotonic()
        if now - self._last_summary >= self.interval_s:
            self._last_summary = now
            log.info("%s", self.summary())

    def prometheus(self) -> str:
        lines = []
        for name in COUNTERS:
            metric = f"inflight_{self.component}_{name}_total"
            lines += [f"# TYPE {metric} counter", f"{metric} {self.values[name]}"]
        for name in GAUGES:
            metric = f"inflight_{self.component}_{name}"
            lines += [f"# TYPE {metric} gauge", f"{metric} {self.values[name]}"]
        return "\n".join(lines) + "\n"

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Start the /metrics endpoint in a daemon thread; returns the bound port (0 = any)."""
        metrics = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path.rstrip("/") not in ("/metrics", ""):
                    self.send_error(404, "try /metrics")
                    return
                body = metrics.prometheus().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        threading.Thread(target=self._server.serve_forever, name=f"{self.component}-metrics",
                         daemon=True).start()
        return self._server.server_address[1]

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
