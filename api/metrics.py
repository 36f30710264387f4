"""Counters of the API process: responses by route and status, requests submitted by model
(`model_name`, vLLM's label) and kind, plus a few named counters;
Prometheus text at GET /metrics and a one-line summary in the log every
`INFLIGHT_METRICS_INTERVAL_S` (the per-request access log is off by default).

Plain ints and dicts mutated on the event loop thread only, so no locks.
"""

from __future__ import annotations

import logging
import time
from collections import Counter

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("inflight.api")

NAMED = ("submitted", "submit_groups", "poll_groups", "duplicates", "cancels", "chat_completions",
         "completions", "messages", "token_counts", "embeddings", "streams_opened", "auth_failures", "files_uploaded", "files_deleted",
         "batches_created", "broker_fast_fails")


class ApiMetrics:
    def __init__(self, interval_s: float = 10.0):
        self.responses: Counter[tuple[str, str, int]] = Counter()
        self.by_model: Counter[tuple[str, str]] = Counter()   # (model, kind) -> submitted
        self.values: dict[str, int] = dict.fromkeys(NAMED, 0)
        self.open_streams = 0
        self.seconds_total = 0.0
        self.interval_s = interval_s
        self._last_summary = time.monotonic()

    def inc(self, name: str, n: int = 1) -> None:
        self.values[name] += n

    def submitted(self, model: str, kind: str) -> None:
        """One request of `kind` (a NAMED counter: chat_completions, ...) for `model`."""
        self.by_model[(model, kind)] += 1

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        self.responses[(method, route, status)] += 1
        self.seconds_total += seconds
        if self.interval_s > 0 and time.monotonic() - self._last_summary >= self.interval_s:
            self._last_summary = time.monotonic()
            log.info(self.summary())

    def summary(self) -> str:
        total = sum(self.responses.values())
        errors = sum(n for (_, _, status), n in self.responses.items() if status >= 500)
        named = " ".join(f"{k}={v}" for k, v in self.values.items())
        return (f"api: responses={total} 5xx={errors} open_streams={self.open_streams} "
                f"{named}")

    def prometheus(self) -> str:
        lines = ["# TYPE inflight_api_responses_total counter"]
        for (method, route, status), n in sorted(self.responses.items()):
            lines.append(f'inflight_api_responses_total{{method="{method}",route="{route}",'
                         f'status="{status}"}} {n}')
        lines.append("# TYPE inflight_api_model_requests_total counter")
        for (model, kind), n in sorted(self.by_model.items()):
            name = model.replace("\\", "\\\\").replace('"', '\\"')
            lines.append(f'inflight_api_model_requests_total{{model_name="{name}",kind="{kind}"}} {n}')
        lines.append("# TYPE inflight_api_response_seconds_total counter")
        lines.append(f"inflight_api_response_seconds_total {self.seconds_total:.6f}")
        lines.append("# TYPE inflight_api_open_streams gauge")
        lines.append(f"inflight_api_open_streams {self.open_streams}")
        for name, value in self.values.items():
            lines.append(f"# TYPE inflight_api_{name}_total counter")
            lines.append(f"inflight_api_{name}_total {value}")
        return "\n".join(lines) + "\n"


class MetricsMiddleware:
    """Counts every response by method, route template (not the raw path: ids would blow
    up the label set) and status. Streaming responses count when their headers go out."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = {"code": 500}

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", "unmatched")
            self.metrics.observe(scope["method"], template, status["code"],
                                 time.perf_counter() - start)
