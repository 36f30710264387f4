"""`curl` of a running worker's and recorder's /metrics during a real run (embedded broker,
tiny Llama, SQLite): every metric of issue 14 is exported with plausible values."""

from __future__ import annotations

import socket
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from inflight.schemas import SamplingParams
from tests.consumers.conftest import Service, make_settings, tiny_engine, wait_rows

pytestmark = [pytest.mark.broker]

WORKER_METRICS = ("vllm:num_requests_running", "vllm:num_requests_waiting",
                  "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries", "vllm:prefix_cache_hits",
                  "vllm:num_preemptions", "vllm:prompt_tokens", "vllm:generation_tokens",
                  "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
                  "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
                  "inflight_worker_dlq", "inflight_kafka_consumer_lag")
RECORDER_METRICS = ("inflight_recorder_batch_size", "inflight_recorder_commit_latency_seconds",
                    "inflight_kafka_consumer_lag", "inflight_recorder_rows_written")


def free_port_pair() -> int:
    """A port P with P+1 free too (the recorder serves on the worker's port + 1)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            with socket.socket() as s2:
                s2.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no free pair of ports")


def scrape(port: int) -> dict[str, list]:
    """{family name: [samples]} as Prometheus would parse GET /metrics."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(body)}


def sample(families, family: str, suffix: str = "", **labels) -> float:
    name = family + suffix
    values = [s.value for s in families[family]
              if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert values, f"{name} {labels} not exported"
    return sum(values)


def test_worker_and_recorder_endpoints_during_a_run(broker, tiny_model, tmp_path):
    from inflight.producers.client import Client
    from inflight.store import Store

    url = f"sqlite:///{tmp_path / 'inflight.db'}"
    store = Store(url, create=True)
    port = free_port_pair()
    settings = make_settings(broker, url, partitions=2, metrics_port=port,
                             metrics_lag_interval_s=0.2)
    engine = tiny_engine(tiny_model, block_size=4, max_num_seqs=4)
    # NOTE: the engine steps on a thread of its own: the tiny model would finish the run
    # between two scrapes. 10 ms a step keeps it going for ~0.5 s (a throttle, nothing more).
    step = engine.step
    engine.step = lambda: (time.sleep(0.01), step())[1]
    svc = Service(settings, engine, store)
    client = Client(settings, store=store)
    try:
        prefix = "the quick brown fox jumps over the lazy dog " * 3  # shared prefix: cache hits
        ids = [client.submit(prefix + f"number {i}", SamplingParams(max_tokens=16, ignore_eos=True))
               for i in range(8)]
        client.producer.send(settings.topic_requests, key=b"bad-1", value=b"not json")
        client.flush()
        peak = {"running": 0.0, "kv": 0.0, "waiting": 0.0}
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # scrape while the run goes on
            fam = scrape(port)
            peak["running"] = max(peak["running"], sample(fam, "vllm:num_requests_running"))
            peak["waiting"] = max(peak["waiting"], sample(fam, "vllm:num_requests_waiting"))
            peak["kv"] = max(peak["kv"], sample(fam, "vllm:kv_cache_usage_perc"))
            rows = store.get_requests(ids)
            if sum(r.status == "completed" for r in rows.values()) == len(ids):
                break
            time.sleep(0.05)
        rows = wait_rows(store, ids, timeout=30)
        assert all(rows[i].status == "completed" for i in ids)
        time.sleep(0.6)  # a last engine-stats update and lag probe after the final commits
        worker, recorder = scrape(port), scrape(port + 1)
    finally:
        svc.stop()
        client.close()

    for name in WORKER_METRICS:
        assert name in worker, f"worker does not export {name}"
    for name in RECORDER_METRICS:
        assert name in recorder, f"recorder does not export {name}"

    # during the run: requests ran (at most max_num_seqs=4 at once) with KV in use; the gauges
    # are sampled every 0.25 s, so the short waiting phase may or may not be caught
    assert 1 <= peak["running"] <= 4 and 0 <= peak["waiting"] <= len(ids) - 1
    assert 0 < peak["kv"] <= 1
    # after it: idle engine, every token counted
    assert sample(worker, "vllm:num_requests_running") == 0
    prompt = sum(r.usage["prompt_tokens"] for r in rows.values() if r.id in ids)
    assert sample(worker, "vllm:prompt_tokens", "_total") == prompt
    assert sample(worker, "vllm:generation_tokens", "_total") == 16 * len(ids)
    assert 0 < sample(worker, "vllm:prefix_cache_hits", "_total") < sample(
        worker, "vllm:prefix_cache_queries", "_total")
    assert sample(worker, "vllm:num_preemptions", "_total") >= 0
    n = len(ids)
    assert sample(worker, "vllm:time_to_first_token_seconds", "_count") == n
    assert sample(worker, "vllm:e2e_request_latency_seconds", "_count") == n
    assert sample(worker, "vllm:request_queue_time_seconds", "_count") == n  # the bad one never queued
    assert sample(worker, "vllm:inter_token_latency_seconds", "_count") == n * 15
    ttft = sample(worker, "vllm:time_to_first_token_seconds", "_sum") / n
    e2e = sample(worker, "vllm:e2e_request_latency_seconds", "_sum") / n
    assert 0 < ttft < e2e < 90
    assert sample(worker, "inflight_worker_dlq", "_total") == 1
    # consumer lag per partition of the worker group (values indicative only on Tansu: its end
    # offsets are wrong); committed offsets are exact: every request message is committed
    group = settings.worker_group
    for p in ("0", "1"):
        sample(worker, "inflight_kafka_consumer_lag", group=group, topic=settings.topic_requests,
               partition=p)
    assert sample(worker, "inflight_kafka_committed_offset", group=group,
                  topic=settings.topic_requests) == n + 1
    # recorder: batch sizes sum to the rows written; one commit latency per batch
    batches = sample(recorder, "inflight_recorder_batch_size", "_count")
    assert batches >= 1
    assert sample(recorder, "inflight_recorder_batch_size", "_sum") == sample(
        recorder, "inflight_recorder_rows_written", "_total")
    assert sample(recorder, "inflight_recorder_commit_latency_seconds", "_count") == batches
    assert 0 < sample(recorder, "inflight_recorder_commit_latency_seconds", "_sum") < 60
    sample(recorder, "inflight_kafka_consumer_lag", group=settings.recorder_group,
           topic=settings.topic_results, partition="0")
