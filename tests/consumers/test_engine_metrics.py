"""vLLM-named engine metrics from RequestOutputs and Engine.stats() (no broker needed)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from inflight.consumers.engine_metrics import EngineMetrics
from inflight.engine.outputs import RequestOutput
from tests.consumers.step_metrics import StepMetrics


def value(reg: CollectorRegistry, name: str, **labels) -> float:
    got = reg.get_sample_value(name, {"model_name": "m", **labels})
    assert got is not None, f"{name} {labels} is not exported"
    return got


def out(rid, new, *, finished=False, reason=None, arrival=100.0, first=None, finish=None,
        prompt=5):
    return RequestOutput(rid, list(new), "", list(new), "", finished, reason,
                         num_prompt_tokens=prompt, arrival_time=arrival, first_token_time=first,
                         finish_time=finish)


def test_latency_histograms_and_token_counters_follow_the_outputs():
    reg = CollectorRegistry()
    m = StepMetrics(reg, "m")
    m.observe_outputs([out("a", [1], first=100.5), out("b", [7], first=100.5, prompt=3)], 100.5)
    m.observe_outputs([out("a", [2], first=100.5)], 100.7)
    m.observe_outputs([out("a", [3], first=100.5, finished=True, reason="length", finish=101.0),
                       out("b", [], first=100.5, finished=True, reason="abort", finish=100.9)], 101.0)
    m.observe_outputs([out("c", [], finished=True, reason="error", finish=101.0)], 101.0)
    assert value(reg, "vllm:time_to_first_token_seconds_count") == 2
    assert value(reg, "vllm:time_to_first_token_seconds_sum") == 1.0  # 0.5 + 0.5
    assert value(reg, "vllm:inter_token_latency_seconds_count") == 2  # a: 100.5->100.7->101.0
    assert abs(value(reg, "vllm:inter_token_latency_seconds_sum") - 0.5) < 1e-9
    assert value(reg, "vllm:e2e_request_latency_seconds_count") == 2  # a and b; not the error
    assert abs(value(reg, "vllm:e2e_request_latency_seconds_sum") - 1.9) < 1e-9
    assert value(reg, "vllm:prompt_tokens_total") == 8  # once per request, at its first token
    assert value(reg, "vllm:generation_tokens_total") == 4
    assert value(reg, "vllm:request_success_total", finished_reason="length") == 1
    assert value(reg, "vllm:request_success_total", finished_reason="abort") == 1
    assert value(reg, "vllm:request_success_total", finished_reason="error") == 1
    assert m._last_token_at == {}  # nothing kept for finished requests
    m.observe_queue_time(0.25)
    m.observe_queue_time(-1.0)  # client clock ahead: clipped
    assert value(reg, "vllm:request_queue_time_seconds_count") == 2
    assert value(reg, "vllm:request_queue_time_seconds_sum") == 0.25


def test_stats_become_gauges_and_monotonic_counters():
    reg = CollectorRegistry()
    m = EngineMetrics(reg, "m")
    stats = {"running": 3, "waiting": 2, "kv_blocks_total": 100, "kv_blocks_used": 25,
             "prefix_cache_queries": 64, "prefix_cache_hit_tokens": 32, "preemptions": 1}
    m.observe_stats(stats)
    m.observe_stats({**stats, "running": 1, "waiting": 0, "kv_blocks_used": 5,
                     "prefix_cache_queries": 96, "prefix_cache_hit_tokens": 48, "preemptions": 1})
    assert value(reg, "vllm:num_requests_running") == 1
    assert value(reg, "vllm:num_requests_waiting") == 0
    assert value(reg, "vllm:kv_cache_usage_perc") == 0.05
    assert value(reg, "vllm:prefix_cache_queries_total") == 96
    assert value(reg, "vllm:prefix_cache_hits_total") == 48
    assert value(reg, "vllm:num_preemptions_total") == 1


def test_the_real_engine_feeds_them(tiny_model):
    from inflight.engine import Engine, EngineConfig, SamplingParams

    engine = Engine(EngineConfig(model=str(tiny_model), num_kv_blocks=64, block_size=4))
    reg = CollectorRegistry()
    m = StepMetrics(reg, "m")
    prefix = list(range(3, 19))
    for i in range(3):
        engine.add_request(f"r{i}", prompt_token_ids=prefix + [20 + i],
                           params=SamplingParams(max_tokens=6, ignore_eos=True))
    import time

    while engine.has_unfinished():
        m.observe_outputs(engine.step(), time.time())
        m.observe_stats(engine.stats())
    assert value(reg, "vllm:generation_tokens_total") == 18
    assert value(reg, "vllm:prompt_tokens_total") == 51
    assert value(reg, "vllm:time_to_first_token_seconds_count") == 3
    assert value(reg, "vllm:inter_token_latency_seconds_count") == 15
    assert value(reg, "vllm:e2e_request_latency_seconds_count") == 3
    assert value(reg, "vllm:prefix_cache_queries_total") > 0
    assert value(reg, "vllm:num_requests_running") == 0


def test_observe_many_equals_observe_one_by_one():
    from prometheus_client import CollectorRegistry, Histogram

    from inflight.consumers.engine_metrics import ITL_BUCKETS, observe_many

    values = [0.0, 0.01, 0.0100001, 0.3, 7.5, 1e6, 0.05, 0.049]
    reg = CollectorRegistry()
    one = Histogram("one", "x", buckets=ITL_BUCKETS, registry=reg)
    many = Histogram("many", "x", buckets=ITL_BUCKETS, registry=reg)
    for v in values:
        one.observe(v)
    observe_many(many, values)
    samples = {m.name: {(s.name.removeprefix(m.name), tuple(sorted(s.labels.items()))): s.value
                        for s in m.samples if not s.name.endswith("_created")}
               for m in reg.collect()}
    assert samples["one"] == samples["many"] and samples["one"][("_count", ())] == len(values)


def test_observe_many_with_weights_equals_repeated_observes():
    from prometheus_client import CollectorRegistry, Histogram

    from inflight.consumers.engine_metrics import ITL_BUCKETS, observe_many

    values, weights = [0.01, 0.3, 7.5], [3, 1, 2]
    reg = CollectorRegistry()
    one = Histogram("one", "x", buckets=ITL_BUCKETS, registry=reg)
    many = Histogram("many", "x", buckets=ITL_BUCKETS, registry=reg)
    for v, n in zip(values, weights):
        for _ in range(n):
            one.observe(v)
    observe_many(many, values, weights)
    samples = {m.name: {s.name.removeprefix(m.name) + str(sorted(s.labels.items())): s.value
                        for s in m.samples if not s.name.endswith("_created")}
               for m in reg.collect()}
    assert samples["many"].keys() == samples["one"].keys()
    for key, v in samples["one"].items():
        assert abs(samples["many"][key] - v) < 1e-9, key
    assert samples["many"]["_count[]"] == 6


def test_speculative_decoding_counters_under_vllms_names(tiny_model):
    """From a real engine's stats(): drafts, draft tokens, accepted tokens and accepted
    tokens per position, as the increments of Engine.stats()' running totals."""
    from inflight.engine import Engine, EngineConfig, SamplingParams

    spec = {"method": "draft_model", "model": str(tiny_model), "num_speculative_tokens": 3}
    eng = Engine(EngineConfig(model=tiny_model, num_kv_blocks=64, speculative_config=spec))
    reg = CollectorRegistry()
    m = EngineMetrics(reg, "m")
    m.observe_stats(eng.stats())
    eng.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=9, temperature=0.0, ignore_eos=True))
    m.observe_stats(eng.stats())
    m.observe_stats(eng.stats())  # counted once
    s = eng.stats()
    assert s["spec_decode_num_drafts"] > 0 and s["spec_decode_acceptance_rate"] == 1.0
    assert value(reg, "vllm:spec_decode_num_drafts_total") == s["spec_decode_num_drafts"]
    assert value(reg, "vllm:spec_decode_num_draft_tokens_total") == s["spec_decode_num_draft_tokens"]
    assert value(reg, "vllm:spec_decode_num_accepted_tokens_total") == s["spec_decode_num_accepted_tokens"]
    for pos, n in enumerate(s["spec_decode_accepted_per_pos"]):
        assert value(reg, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(pos)) == n
    assert s["spec_decode_mean_accepted_length"] == 1 + s["spec_decode_num_accepted_tokens"] / s["spec_decode_num_drafts"]
