"""The Grafana dashboard and Prometheus config chart only metrics the code exports."""

from __future__ import annotations

import re

import orjson
import yaml

from inflight.consumers.engine_metrics import EngineMetrics
from inflight.consumers.lag import LagProbe
from inflight.consumers.metrics import Metrics
from inflight.schemas import Settings
from tests.deploy.files import ROOT

DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "inflight.json"
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
            "gauge": ("",), "summary": ("_sum", "_count")}
METRIC = re.compile(r"\b((?:vllm:|inflight_)[a-zA-Z0-9_:]+)")


def exported_names() -> set[str]:
    """Sample names the worker, the recorder and the API expose (built as they build them)."""
    from inflight.api.metrics import ApiMetrics
    from inflight.consumers.recorder import Recorder

    worker = Metrics("worker", labels={"model_name": "m"})
    EngineMetrics(worker.registry, "m")
    LagProbe(Settings(), "g", [], worker.registry)  # not started: no broker needed
    recorder = Recorder(Settings(database_url="sqlite://"), store=object())
    LagProbe(Settings(), "g", [], recorder.metrics.registry)
    names = set()
    for registry in (worker.registry, recorder.metrics.registry):
        for family in registry.collect():
            names |= {family.name + s for s in SUFFIXES[family.type]}
    api = ApiMetrics()
    api.submitted("m", "chat_completions")
    names |= {line.split("{")[0].split(" ")[0] for line in api.prometheus().splitlines()
              if line and not line.startswith("#")}
    return names


def test_every_path_metric_of_the_worker_carries_the_model():
    """The model selector filters the worker's path metrics as it does the engine's."""
    dash = orjson.loads(DASHBOARD.read_bytes())
    for p in dash["panels"]:
        for t in p["targets"]:
            for name in METRIC.findall(t["expr"]):
                if name.startswith(("inflight_worker_", "vllm:", "inflight_api_model_")):
                    assert f'{name}{{model_name=~"$model"' in t["expr"], (p["title"], t["expr"])
    worker = Metrics("worker", labels={"model_name": "gemma"})
    worker.inc("completed")
    assert 'inflight_worker_completed_total{model_name="gemma"} 1.0' in worker.prometheus()


def test_every_charted_metric_is_exported():
    dash = orjson.loads(DASHBOARD.read_bytes())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in METRIC.findall(e)}
    exported = exported_names()
    assert used and used <= exported, f"charted but not exported: {sorted(used - exported)}"
    # the list is charted
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total",
                 "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                 "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
                 "vllm:e2e_request_latency_seconds_bucket", "vllm:request_queue_time_seconds_bucket",
                 "inflight_kafka_consumer_lag", "inflight_worker_dlq_total",
                 "inflight_recorder_batch_size_sum", "inflight_recorder_commit_latency_seconds_bucket",
                 "vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                 "vllm:spec_decode_num_accepted_tokens_total",
                 "vllm:spec_decode_num_accepted_tokens_per_pos_total"):
        assert name in used, f"{name} is not charted"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))


def test_prometheus_scrapes_the_compose_services_on_their_ports():
    conf = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    targets = {c["job_name"]: c["dns_sd_configs"][0] for c in conf["scrape_configs"]}
    assert targets["inflight-worker"]["names"] == ["worker", "worker-gemma"]
    assert targets["inflight-worker"]["port"] == 9400
    assert targets["inflight-recorder"]["names"] == ["recorder"]
    assert targets["inflight-recorder"]["port"] == 9401  # INFLIGHT_METRICS_PORT + 1
    assert targets["inflight-api"]["names"] == ["api"] and targets["inflight-api"]["port"] == 8000
