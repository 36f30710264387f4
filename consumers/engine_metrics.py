"""The engine's metrics under vLLM's names, so existing vLLM dashboards and alerts apply.

Fed by the worker's threads, never the HTTP thread: the publisher, in its one pass over
each step's outputs, calls `observe_first()` at a request's first token,
`observe_finished()` at its end and `observe_tokens()` once per step (histograms and token
counters from `RequestOutput` timings); the engine loop calls `observe_stats()` every so
often (gauges and counters from `Engine.stats()`, read on the engine's thread: the engine
is not thread-safe). Times are `time.time()` seconds, as in RequestOutput.

Meanings (as vLLM's): arrival = the engine received the request (the worker admitted it);
TTFT = first token - arrival; inter-token latency = time between two token outputs of a
request; e2e = finish - arrival; queue time = submitted (client clock) -> admitted, i.e.
the time a request waited in Kafka or behind a paused partition (observed by the worker's
intake through `observe_queue_time`); prompt tokens are counted once per request, at its
first token, cached ones included; generation tokens are the output tokens produced.
Speculative decoding (vLLM's spec_decode counters): drafts = verifications that checked at
least one draft token, draft tokens checked, accepted tokens, and accepted tokens per draft
position (label `position`, 0-based); acceptance rate = accepted / draft tokens, mean
accepted length = 1 + accepted / drafts.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

if TYPE_CHECKING:
    from inflight.engine.outputs import RequestOutput

# Buckets in the spirit of vLLM's (sub-second to tens of minutes), so its dashboards read well.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
               10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                           50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
FINISHED = ("stop", "length", "abort", "error")


def observe_many(histogram: Any, values: list[float], weights: list[int] | None = None) -> None:
    """`histogram.observe(v)` for every value (`weights[i]` times the i-th), as one update
    per bucket touched.

    NOTE: a prometheus_client histogram takes two locks and a linear bucket scan per
    observe(); at one inter-token observation per token that was a large share of the
    worker's delivery cost. This adds to the child's bucket counters and sum directly
    (its `_upper_bounds`, `_buckets`, `_sum`), and falls back to observe() where a
    prometheus_client version lacks them."""
    bounds = getattr(histogram, "_upper_bounds", None)
    buckets = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    weights = weights if weights is not None else [1] * len(values)
    if bounds is None or buckets is None or total is None:
        for v, n in zip(values, weights):
            for _ in range(n):
                histogram.observe(v)
        return
    counts = [0] * len(bounds)
    added = 0.0
    for v, n in zip(values, weights):
        counts[bisect_left(bounds, v)] += n  # the first bound >= v, as observe() picks
        added += v * n
    for i, n in enumerate(counts):
        if n:
            buckets[i].inc(n)
    total.inc(added)


class EngineMetrics:
    def __init__(self, registry: CollectorRegistry, model_name: str):
        labels = ["model_name"]

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, labels, registry=registry).labels(model_name)

        def gauge(name: str, doc: str) -> Any:
            return Gauge(name, doc, labels, registry=registry).labels(model_name)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Any:
            return Histogram(name, doc, labels, buckets=buckets, registry=registry).labels(model_name)

        self.running = gauge("vllm:num_requests_running", "requests in the running batch")
        self.waiting = gauge("vllm:num_requests_waiting", "requests waiting to be scheduled")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage; 1 means 100 percent")
        self.prefix_queries = counter("vllm:prefix_cache_queries",
                                      "prefix cache queries, in tokens")
        self.prefix_hits = counter("vllm:prefix_cache_hits", "prefix cache hits, in tokens")
        self.preemptions = counter("vllm:num_preemptions", "cumulative preemptions")
        self.prompt_tokens = counter("vllm:prompt_tokens", "prefill tokens processed")
        self.generation_tokens = counter("vllm:generation_tokens", "generation tokens processed")
        self.ttft = histogram("vllm:time_to_first_token_seconds", "time to first token",
                              TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "inter-token latency", ITL_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "end-to-end request latency",
                             REQUEST_LATENCY_BUCKETS)
        self.queue_time = histogram("vllm:request_queue_time_seconds",
                                    "time a request waited before the engine received it",
                                    REQUEST_LATENCY_BUCKETS)
        success = Counter("vllm:request_success", "finished requests by finish reason",
                          ["model_name", "finished_reason"], registry=registry)
        self.success = {reason: success.labels(model_name, reason) for reason in FINISHED}
        self.spec_drafts = counter("vllm:spec_decode_num_drafts",
                                   "speculative verifications that checked at least one draft token")
        self.spec_draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "draft tokens checked")
        self.spec_accepted = counter("vllm:spec_decode_num_accepted_tokens", "draft tokens accepted")
        self._per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                                "draft tokens accepted, by draft position",
                                ["model_name", "position"], registry=registry)
        self._model_name = model_name
        self._totals = {"prefix_cache_queries": 0, "prefix_cache_hit_tokens": 0, "preemptions": 0,
                        "spec_decode_num_drafts": 0, "spec_decode_num_draft_tokens": 0,
                        "spec_decode_num_accepted_tokens": 0}
        self._per_pos_totals: list[int] = []
        self._registry = registry
        self._lora = LoraMetrics(registry, model_name)

    def observe_first(self, out: RequestOutput, now: float) -> float:
        """A request's first token(s) (TTFT, its prompt tokens); returns the time of its
        first token, from which its next inter-token gap counts."""
        first = out.first_token_time or now
        self.ttft.observe(max(0.0, first - out.arrival_time))
        self.prompt_tokens.inc(out.num_prompt_tokens)
        return first

    def observe_finished(self, out: RequestOutput) -> None:
        reason = out.finish_reason if out.finish_reason in self.success else "error"
        self.success[reason].inc()
        if reason != "error" and out.finish_time is not None:
            self.e2e.observe(max(0.0, out.finish_time - out.arrival_time))

    def observe_tokens(self, tokens: int, gaps: dict[float, int], now: float) -> None:
        """One step's generated tokens, and its inter-token gaps as {previous token's time:
        how many requests had theirs then} (each ends at `now`)."""
        if tokens:
            self.generation_tokens.inc(tokens)
        if gaps:
            observe_many(self.itl, [max(0.0, now - prev) for prev in gaps], list(gaps.values()))

    def observe_queue_time(self, seconds: float) -> None:
        self.queue_time.observe(max(0.0, seconds))

    def observe_stats(self, stats: dict[str, Any]) -> None:
        """An `Engine.stats()` snapshot: gauges set, cumulative counts turned into increments."""
        self.running.set(stats.get("running", 0))
        self.waiting.set(stats.get("waiting", 0))
        total = stats.get("kv_blocks_total") or 0
        self.kv_usage.set(stats.get("kv_blocks_used", 0) / total if total else 0.0)
        for key, counter in (("prefix_cache_queries", self.prefix_queries),
                             ("prefix_cache_hit_tokens", self.prefix_hits),
                             ("preemptions", self.preemptions),
                             ("spec_decode_num_drafts", self.spec_drafts),
                             ("spec_decode_num_draft_tokens", self.spec_draft_tokens),
                             ("spec_decode_num_accepted_tokens", self.spec_accepted)):
            value = stats.get(key, 0)
            if value > self._totals[key]:
                counter.inc(value - self._totals[key])
            self._totals[key] = value
        if "lora_loaded" in stats:  # an engine with adapter slots
            self._lora.observe(stats)
        per_pos = stats.get("spec_decode_accepted_per_pos") or []
        seen = self._per_pos_totals
        for pos in range(len(seen), len(per_pos)):  # every position exported, from 0
            self._per_pos.labels(self._model_name, str(pos))
            seen.append(0)
        for pos, value in enumerate(per_pos):
            if value > seen[pos]:
                self._per_pos.labels(self._model_name, str(pos)).inc(value - seen[pos])
                seen[pos] = value


LORA_LOAD_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class LoraMetrics:
    """LoRA adapters (engine/lora): vLLM's `vllm:lora_requests_info` (value: the time of the
    last change; labels: the adapters of running and of waiting requests, comma-separated,
    and max_lora), slot loads, evictions and load times."""

    def __init__(self, registry: CollectorRegistry, model_name: str):
        self._info = Gauge("vllm:lora_requests_info", "running and waiting LoRA adapters",
                           ["model_name", "max_lora", "running_lora_adapters", "waiting_lora_adapters"],
                           registry=registry)
        self._loads = Counter("inflight_lora_loads", "LoRA adapters loaded into a slot",
                              ["model_name"], registry=registry).labels(model_name)
        self._evictions = Counter("inflight_lora_evictions", "idle LoRA adapters evicted from a slot",
                                  ["model_name"], registry=registry).labels(model_name)
        self._resident = Gauge("inflight_lora_resident", "LoRA adapters resident in slots",
                               ["model_name"], registry=registry).labels(model_name)
        self._load_time = Histogram("inflight_lora_load_seconds", "time to load a LoRA adapter into a slot",
                                    ["model_name"], buckets=LORA_LOAD_BUCKETS,
                                    registry=registry).labels(model_name)
        self._model_name = model_name
        self._labels: tuple[str, ...] | None = None
        self._totals = {"lora_loads": 0, "lora_evictions": 0}

    def observe(self, stats: dict[str, Any]) -> None:
        labels = (self._model_name, str(stats.get("lora_max", 0)),
                  ",".join(stats.get("lora_running") or []), ",".join(stats.get("lora_waiting") or []))
        if labels != self._labels:
            if self._labels is not None:
                self._info.remove(*self._labels)
            self._info.labels(*labels).set(time.time())
            self._labels = labels
        for key, counter in (("lora_loads", self._loads), ("lora_evictions", self._evictions)):
            value = stats.get(key, 0)
            if value > self._totals[key]:
                counter.inc(value - self._totals[key])
            self._totals[key] = value
        self._resident.set(stats.get("lora_resident", 0))
        for seconds in stats.get("lora_load_seconds_new") or ():
            self._load_time.observe(seconds)
