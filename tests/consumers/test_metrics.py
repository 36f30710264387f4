"""Counters, the one-line summary and the Prometheus text endpoint."""

from __future__ import annotations

import logging
import urllib.request

from inflight.consumers.metrics import Metrics


def test_prometheus_endpoint_and_summary(caplog):
    m = Metrics("worker", interval_s=0.001)
    m.inc("received", 3)
    m.inc("tokens_out", 40)
    m.set("in_flight", 2)
    m.set("paused_partitions", 1)
    port = m.serve(0)
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        m.close()
    assert "# TYPE inflight_worker_received_total counter" in body
    assert "inflight_worker_received_total 3" in body
    assert "inflight_worker_tokens_out_total 40" in body
    assert "inflight_worker_in_flight 2" in body and "inflight_worker_paused_partitions 1" in body
    with caplog.at_level(logging.INFO, logger="inflight.metrics"):
        m._last_summary = 0.0
        m.maybe_log()
    assert "received=3" in caplog.text and "in_flight=2" in caplog.text
