"""Counters of the worker and the recorder: a periodic one-line summary and a Prometheus
endpoint (`GET /metrics`), both from one `prometheus_client` registry per instance.

`inc`/`set` keep a plain dict for the summary line and `metrics[name]`, and update the
registry's `inflight_<component>_<name>_total` counters / `inflight_<component>_<name>`
gauges. Components add their own metrics to `self.registry` (consumers.engine_metrics:
vLLM's names for the engine; consumers.lag: consumer lag per partition; the recorder's
batch size and commit latency histograms below).

`labels` are constant labels of every counter and gauge of the instance: a worker's
`model_name` (vLLM's label, as on its engine metrics), so a deployment of several models
reads each one's path apart.

NOTE: no global registry: two workers in one process (tests) never share a metric.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, start_http_server

log = logging.getLogger("inflight.metrics")

COUNTERS = ("received", "admitted", "completed", "failed", "cancelled", "dlq", "duplicates",
            "tokens_out", "commits", "rows_written", "db_retries", "rows_refused",
            "records_skipped")
# the worker's delivery path
COUNTERS += ("token_events", "send_retries", "send_errors", "handed_back", "rebalances",
             "rejoins", "expired")
GAUGES = ("in_flight", "paused_partitions", "commit_lag", "publisher_behind")
DOC = {
    "received": "messages polled from Kafka", "admitted": "requests handed to the engine",
    "completed": "requests that ended with a result", "failed": "requests that ended with an error",
    "cancelled": "requests cancelled or aborted",
    "expired": "requests ended at their deadline (InferenceRequest.timeout / deadline)", "dlq": "raw messages sent to the dead-letter topic",
    "duplicates": "messages whose request id was in flight or recently finished",
    "tokens_out": "output tokens published", "commits": "offset commits",
    "rows_written": "rows upserted into the store", "db_retries": "database writes retried",
    "rows_refused": "rows the database refused (a stand-in row was stored instead)",
    "records_skipped": "records the recorder could not turn into a row (logged and skipped)",
    "in_flight": "requests held in memory", "paused_partitions": "partitions paused for backpressure",
    "commit_lag": "polled offsets not yet committable (waiting for final acks)",
    # the worker's delivery path
    "token_events": "coalesced token deltas published", "send_retries": "sends retried after "
    "a transient error", "send_errors": "sends refused or lost (a final is replaced by an error "
    "final, a DLQ copy loses its body, a token delta is dropped)",
    "handed_back": "requests stopped because their partition moved or the worker stopped",
    "rebalances": "partition revocations seen",
    "rejoins": "times the worker left its group and joined again as a new member, having "
    "stayed unassigned while partitions had no owner",
    "publisher_behind": "1 while engine steps wait unpublished (a slow or stalled broker): "
    "nothing new is admitted",
}


class Metrics:
    def __init__(self, component: str, interval_s: float = 10.0,
                 labels: dict[str, str] | None = None, tenant_label: bool = False):
        """`tenant_label`: the per-tenant token counters carry a `tenant` label
        (INFLIGHT_TENANT_METRICS; one series per tenant), else one series for all."""
        self.component = component
        self.labels = dict(labels or {})
        self.values: dict[str, float] = dict.fromkeys(COUNTERS + GAUGES, 0)
        self.interval_s = interval_s
        self.registry = CollectorRegistry()
        self.port: int | None = None
        names = list(self.labels)

        def labelled(metric: Any) -> Any:
            return metric.labels(**self.labels) if names else metric

        self._counters = {n: labelled(Counter(f"inflight_{component}_{n}", DOC[n], names,
                                              registry=self.registry)) for n in COUNTERS}
        self._gauges = {n: labelled(Gauge(f"inflight_{component}_{n}", DOC[n], names,
                                          registry=self.registry)) for n in GAUGES}
        self._last_summary = time.monotonic()
        self._server = None
        self._lock = threading.Lock()
        self.tenant_label = tenant_label
        tenant_names = names + ["tenant"] if tenant_label else names
        self._tenant_tokens = tuple(
            Counter(f"inflight_tenant_{kind}_tokens", f"{kind} tokens of finished requests "
                    "(by tenant with INFLIGHT_TENANT_METRICS)", tenant_names,
                    registry=self.registry) for kind in ("prompt", "output"))
        self._tenant_children: dict[str | None, tuple[Any, Any]] = {}

    def tenant_tokens(self, tenant: str | None, prompt: int, output: int) -> None:
        """Count a finished request's tokens for its tenant (usage)."""
        pair = self._tenant_children.get(tenant if self.tenant_label else None)
        if pair is None:
            labels = dict(self.labels)
            if self.tenant_label:
                labels["tenant"] = tenant or ""
            pair = tuple(c.labels(**labels) if labels else c for c in self._tenant_tokens)
            self._tenant_children[tenant if self.tenant_label else None] = pair
        pair[0].inc(prompt)
        pair[1].inc(output)

    def inc(self, name: str, n: float = 1) -> None:
        # NOTE: the worker's intake, engine and publisher threads all count; `+=` on a dict
        # entry is not atomic, so the summary's copy takes a lock (prometheus_client's metrics lock
        # themselves).
        with self._lock:
            self.values[name] += n
        self._counters[name].inc(n)

    def set(self, name: str, value: float) -> None:
        self.values[name] = value
        self._gauges[name].set(value)

    def __getitem__(self, name: str) -> float:
        return self.values[name]

    def histogram(self, name: str, doc: str, buckets: tuple[float, ...]) -> Any:
        """A histogram `inflight_<component>_<name>` in this instance's registry (with the
        instance's labels set)."""
        h = Histogram(f"inflight_{self.component}_{name}", doc, list(self.labels),
                      buckets=buckets, registry=self.registry)
        return h.labels(**self.labels) if self.labels else h

    # -- output ---------------------------------------------------------------------------
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
        """The exposition text the endpoint serves."""
        return generate_latest(self.registry).decode()

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Start the /metrics endpoint in a daemon thread; returns the bound port (0 = any)."""
        self._server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self.port = self._server.server_port
        return self.port

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
