"""Tracing's cost on the worker: the step (engine step + the publisher handling its outputs:
token deltas, finals, acks) with OpenTelemetry off and on, in the same run.

    python benchmarks/tracing_overhead.py [--model DIR] [--num-requests 64] [--rounds 6]
                                          [--max-tokens 32] [--json PATH] [--plot PATH]

Default model: a tiny random Llama (2 layers, 64 wide), whose steps are the shortest there are,
so tracing's share of a step is the largest it can be; --model DIR runs a real folder. Each
round runs the same --num-requests greedy requests to the end, once with the publisher's
tracer None (off: what every process runs without an OTLP endpoint) and once with an SDK
tracer whose spans go through a BatchSpanProcessor (what `INFLIGHT_OTEL_EXPORTER_OTLP_ENDPOINT`
sets up) into an in-memory exporter (no network: the cost measured is inflight's and the
SDK's, not a collector's). Off and on alternate round by round. The producer is a null one
that acknowledges every send at once (this measures the worker's own work, not Kafka's).
Reported: median step ms (wall and this thread's CPU), the publisher's µs per request over
all its steps (wall and CPU; the spans are made in the step that finishes it), and the spans
exported (5 per request when on). CPU times are the steadier figures on a loaded machine.
"""

from __future__ import annotations

import pathlib
import queue
import statistics
import tempfile
import time

from common import base_parser, machine_note, print_table, setup_torch, write_json


class _Ack:
    """kafka-python's future, acknowledged at once."""

    def add_callback(self, fn, *args):
        fn(*args, None)
        return self

    def add_errback(self, fn, *args):
        return self


class NullProducer:
    acks_in_poll = False

    def send(self, topic, key=None, value=None, headers=None, partition=None):
        return _Ack()

    def send_untracked(self, topic, key, value, partition, on_error, headers=None):
        return None

    def poll_acks(self, timeout=0.0):
        return 0

    def partitions_for(self, topic):
        return {0, 1, 2, 3}

    def flush(self, timeout=None):
        return None

    def close(self, timeout=None):
        return None


def tracer_on():
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider, exporter


def run_round(model, args, tracer) -> dict:
    from inflight.consumers.metrics import Metrics
    from inflight.consumers.publisher import EventPublisher
    from inflight.consumers.thread_messages import Admitted
    from inflight.engine import Engine, EngineConfig, SamplingParams
    from inflight.schemas import Settings
    from inflight.schemas.headers import message_headers, new_traceparent

    engine = Engine(EngineConfig(model=str(model), num_kv_blocks=1024,
                                 max_num_seqs=args.num_requests))
    settings = Settings(stream_interval_ms=0)
    pub = EventPublisher(settings, NullProducer(), queue.SimpleQueue(), worker="bench",
                         metrics=Metrics("worker", 0.0))
    pub.tracer = tracer
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    now = time.time()
    for i in range(args.num_requests):
        rid = f"r{i}"
        headers = message_headers(rid) + [("traceparent", new_traceparent())]
        pub.handle(Admitted(ticket=i, request_id=rid, attempt=f"a.{i}", stream=True,
                            batch_id=None, submitted_at=now, queued_at=now, source="t/0/0",
                            headers=headers))
        engine.add_request(f"a.{i}", prompt_token_ids=[1 + (i * 7 + j) % 250 for j in range(24)],
                           params=params)
    walls, cpus, publish_s, publish_cpu = [], [], 0.0, 0.0
    while engine.has_unfinished():
        w0, c0 = time.perf_counter(), time.thread_time()
        outs = engine.step()
        p0, q0 = time.perf_counter(), time.thread_time()
        pub._outputs(outs, time.time())
        pub.tick()
        p1, q1 = time.perf_counter(), time.thread_time()
        walls.append(p1 - w0)
        cpus.append(q1 - c0)
        publish_s += p1 - p0
        publish_cpu += q1 - q0
    return {"step_ms": 1e3 * statistics.median(walls), "step_cpu_ms": 1e3 * statistics.median(cpus),
            "publish_us_per_request": 1e6 * publish_s / args.num_requests,
            "publish_cpu_us_per_request": 1e6 * publish_cpu / args.num_requests,
            "steps": len(walls)}


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.set_defaults(num_requests=64)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=32)
    args = p.parse_args()
    setup_torch(args.threads, args.seed)
    if args.model:
        model = pathlib.Path(args.model)
    else:
        import sys

        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
        from tests.tiny_llama import write_tiny_llama

        model = write_tiny_llama(pathlib.Path(tempfile.mkdtemp()) / "tiny")
    provider, exporter = tracer_on()
    tracer = provider.get_tracer("inflight.worker")
    run_round(model, args, None)  # warm-up
    results = {"off": [], "on": []}
    for _ in range(args.rounds):
        results["off"].append(run_round(model, args, None))
        results["on"].append(run_round(model, args, tracer))
    provider.force_flush()
    spans = len(exporter.get_finished_spans())

    def med(mode, key):
        return statistics.median(r[key] for r in results[mode])

    rows = []
    for key, label in (("step_ms", "step, wall ms (median)"), ("step_cpu_ms", "step, CPU ms (median)"),
                       ("publish_us_per_request", "publisher µs per request, wall (all its steps)"),
                       ("publish_cpu_us_per_request", "publisher µs per request, CPU")):
        off, on = med("off", key), med("on", key)
        rows.append((label, f"{off:.3f}", f"{on:.3f}", f"{100 * (on - off) / off:+.1f}%"))
    print(machine_note())
    print(f"model {model.name}, {args.num_requests} requests x {args.max_tokens} tokens, "
          f"{args.rounds} rounds each way, {spans} spans exported "
          f"({spans / (args.rounds * args.num_requests):.1f} per traced request)")
    print_table("Tracing off vs on (same run, alternating rounds)", rows,
                ("figure", "off", "on", "on vs off"))
    write_json(args.json, {"results": results, "spans": spans, "model": str(model)})
    if args.plot:
        plot(args.plot, results)


def plot(path: str, results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
    for ax, key, title in ((axes[0], "step_ms", "worker step, wall ms"),
                           (axes[1], "step_cpu_ms", "worker step, CPU ms")):
        data = [[r[key] for r in results[m]] for m in ("off", "on")]
        ax.boxplot(data, tick_labels=["tracing off", "tracing on"])
        ax.set_title(title)
        ax.set_ylim(bottom=0)
    fig.suptitle("tracing_overhead.py: each round's median step (same run)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
