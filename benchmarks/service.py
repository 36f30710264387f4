"""Whole service path vs the engine alone, same workload, same run.

    .venv/bin/python benchmarks/service.py [--threads N] [--json out.json] [--skip-postgres]
    .venv/bin/python benchmarks/service.py --engine synthetic [--concurrency 256] ...

`--engine synthetic`: the delivery path's own capacity with a model-free engine, the
worker of commit f1e85d1 beside this one (benchmarks/service_synthetic.py). The rest of
this docstring is about the default, `--engine real`.

On a small shared CPU box use `--threads 1`: with 2 OpenMP threads on 2 busy cores the
engine's own step time swings several-fold between identical runs, which swamps the
comparison (docs/benchmarks.md).

Workload: the engine benchmark's (benchmarks/throughput.py `workload`, imported): 64 requests,
prompt lengths uniform 16-256 tokens, output lengths lognormal (median 48, clipped
8-256), greedy, ignore_eos, SmolLM2-135M fp32 on CPU.

- engine alone: all requests added to one `Engine`, stepped to completion.
- whole path: Client.submit -> embedded Tansu -> worker (same engine config) -> results
  topics -> recorder -> store (SQLite file, then a fresh Postgres database), all real.
  Wall time runs from the first submit to the last final row's commit (`updated_at`);
  latency is per request, submit -> final row.
The recorder runs as its own process (as deployed); the worker runs in this process (its
intake in a thread, its engine loop and publisher in theirs) so its engine is built exactly
like the engine-alone one; a warm-up request goes through the whole path before the clock
starts. The engine-alone runs also step in a fresh thread with the same torch thread count
(see `in_thread`); "engine-thread CPU" is that thread's, and the worker's engine loop's.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile
import threading
import time
import uuid

ROOT = pathlib.Path(__file__).resolve().parents[1]
for p in (str(ROOT), str(ROOT / "benchmarks")):
    if p not in sys.path:
        sys.path.insert(0, p)


from common import percentile as pct, postgres_database  # noqa: E402  (benchmarks/common.py)
from throughput import workload  # noqa: E402  (the engine benchmark's workload)


def engine_config(args, path):
    from inflight.engine import EngineConfig

    return EngineConfig(model=str(path), dtype=args.dtype, device=args.device,
                        max_num_seqs=args.max_num_seqs, kv_cache_bytes=args.kv_cache_mib << 20,
                        max_num_batched_tokens=args.max_num_batched_tokens,
                        enable_prefix_caching=False, seed=args.seed)


def warm(engine) -> None:
    from inflight.engine import SamplingParams

    engine.generate([[100 + i for i in range(32)]], SamplingParams(max_tokens=4, temperature=0.0,
                                                                   ignore_eos=True))


def in_thread(fn, threads: int):
    """Run `fn` in a fresh thread with `threads` torch threads and return its result.

    NOTE: the worker steps its engine in a thread of its own; the engine-alone run does the
    same, so both see the same OpenMP setup (the main thread's and a new thread's thread
    counts differ, and that alone moved this benchmark several-fold on a loaded box)."""
    import torch

    box: dict = {}

    def target():
        torch.set_num_threads(threads)
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            box["error"] = exc

    t = threading.Thread(target=target)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def run_engine(args, path, prompts, outputs) -> dict:
    return in_thread(lambda: _run_engine(args, path, prompts, outputs), args.threads)


def _run_engine(args, path, prompts, outputs) -> dict:
    from inflight.engine import Engine, SamplingParams

    eng = Engine(engine_config(args, path))
    warm(eng)
    finals = {}
    t0, cpu0 = time.perf_counter(), time.thread_time()
    for i, (p, m) in enumerate(zip(prompts, outputs)):
        eng.add_request(str(i), prompt_token_ids=p,
                        params=SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True))
    while eng.has_unfinished():
        for out in eng.step():
            if out.finished:
                finals[out.request_id] = (out, time.perf_counter() - t0)
    wall = time.perf_counter() - t0
    cpu = time.thread_time() - cpu0
    tokens = sum(len(o.token_ids) for o, _ in finals.values())
    lat = [t for _, t in finals.values()]
    return {"wall_s": wall, "output_tokens": tokens, "tok_s": tokens / wall, "engine_cpu_s": cpu,
            "p50_s": pct(lat, 50), "p99_s": pct(lat, 99),
            "token_ids": {int(k): o.token_ids for k, (o, _) in finals.items()}}


class TorchThreads:
    """The engine, with `threads` torch threads set on the thread that first steps it (the
    worker's engine loop), as the engine-alone run sets them on its own thread."""

    def __init__(self, engine, threads: int):
        self.engine, self.threads, self.ready = engine, threads, False

    def step(self):
        if not self.ready:
            import torch

            torch.set_num_threads(self.threads)
            self.ready = True
        return self.engine.step()

    def __getattr__(self, name):
        return getattr(self.engine, name)


def run_service(args, path, prompts, outputs, db_url: str, broker) -> dict:
    import subprocess

    from inflight.consumers.worker import Worker
    from inflight.engine import Engine
    from inflight.cli.commands import settings_env
    from inflight.cli.topics import create_topics
    from inflight.producers.client import Client
    from inflight.schemas import SamplingParams, Settings
    from inflight.store import Store

    tag = uuid.uuid4().hex[:8]
    s = Settings(kafka_bootstrap=broker.bootstrap, kafka_session_timeout_ms=2000,
                 kafka_heartbeat_interval_ms=500, topic_requests=f"b{tag}.requests",
                 topic_requests_batch=f"b{tag}.requests.batch", topic_results=f"b{tag}.results",
                 topic_results_tokens=f"b{tag}.results.tokens",
                 topic_dlq=f"b{tag}.dlq", topic_cancel=f"b{tag}.cancel",
                 worker_group=f"b{tag}-workers", recorder_group=f"b{tag}-recorder",
                 database_url=db_url, worker_max_inflight=args.max_num_seqs,
                 metrics_interval_s=0.0)
    create_topics(s, partitions=args.partitions)
    store = Store(db_url, create=True)
    # The recorder is its own process, as deployed (`inflight recorder`); the worker is a
    # thread here so its engine is built and warmed exactly like the engine-alone run.
    recorder = subprocess.Popen([sys.executable, "-m", "inflight", "recorder"], cwd=ROOT,
                                env={**os.environ, **settings_env(s), "PYTHONPATH": str(ROOT)},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    engine = Engine(engine_config(args, path))
    warm(engine)
    worker = Worker(s, TorchThreads(engine, args.threads)).open()
    cpu = {}
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    client = Client(s)
    try:
        # warm-up through the whole path: both groups joined, every connection open
        probe = client.submit({"prompt_token_ids": [100, 101, 102]},
                              SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
        if not client.wait(probe, timeout=60).done:
            raise RuntimeError("the warm-up request did not finish in 60s")
        cpu["start"] = worker.engine_loop.cpu_s  # the warm-up is not counted
        submitted = {}
        t0 = time.time()
        for i, (p, m) in enumerate(zip(prompts, outputs)):
            rid = f"bench-{tag}-{i}"
            client.submit({"prompt_token_ids": p}, SamplingParams(max_tokens=m, temperature=0.0,
                                                                  ignore_eos=True),
                          request_id=rid, flush=False)
            submitted[rid] = i
        client.flush()
        ids = list(submitted)
        deadline = time.monotonic() + args.timeout
        while True:
            counts = store.count_by_status()
            if counts["completed"] + counts["failed"] >= len(ids) + 1:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {counts} after {args.timeout}s")
            time.sleep(0.25)
        rows = store.get_requests(ids)
        req_submit = {rid: row.created_at.timestamp() for rid, row in rows.items()}
        done_at = {rid: row.updated_at.timestamp() for rid, row in rows.items()}
        wall = max(done_at.values()) - t0
        tokens = sum(len(r.output_token_ids or []) for r in rows.values())
        lat = [done_at[r] - req_submit[r] for r in ids]
        failed = [r for r in ids if rows[r].status != "completed"]
        token_ids = {submitted[r]: rows[r].output_token_ids for r in ids}
        cpu["end"] = worker.engine_loop.cpu_s
        return {"wall_s": wall, "output_tokens": tokens, "tok_s": tokens / wall,
                "engine_cpu_s": cpu.get("end", float("nan")) - cpu.get("start", float("nan")),
                "p50_s": pct(lat, 50), "p99_s": pct(lat, 99), "failed": len(failed),
                "token_ids": token_ids, "worker": worker.metrics.summary()}
    finally:
        client.close()
        worker.stop()
        thread.join(60)
        recorder.terminate()
        recorder.wait(30)
        store.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--kv-cache-mib", type=int, default=1024)
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--postgres-url", default=os.environ.get(
        "INFLIGHT_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"))
    p.add_argument("--skip-postgres", action="store_true")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--engine", choices=("real", "synthetic"), default="real")
    import service_synthetic

    service_synthetic.add_arguments(p)
    args = p.parse_args()
    if args.engine == "synthetic":
        service_synthetic.main(args)
        return

    import logging

    import torch

    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    from inflight.cli.broker import EmbeddedBroker
    from inflight.cli.model import resolve_model

    path = resolve_model(args.model)
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    prompts, outputs = workload(args.num_requests, args.seed, vocab)
    print(f"model {path.name}, {args.dtype} on {args.device}, {args.threads} torch threads, "
          f"{os.cpu_count()} CPUs; {len(prompts)} requests, prompt tokens {sum(map(len, prompts))}, "
          f"output tokens {sum(outputs)}")
    results = {"engine alone": run_engine(args, path, prompts, outputs)}
    print(f"engine alone: {results['engine alone']['wall_s']:.1f}s", flush=True)
    with tempfile.TemporaryDirectory(prefix="inflight-bench-") as tmp, \
            EmbeddedBroker(log_path=pathlib.Path(tmp) / "tansu.log") as broker:
        results["path, SQLite"] = run_service(args, path, prompts, outputs,
                                              f"sqlite:///{tmp}/bench.db", broker)
        print(f"path, SQLite: {results['path, SQLite']['wall_s']:.1f}s", flush=True)
        if not args.skip_postgres:
            url, drop = postgres_database(args.postgres_url)
            if url:
                try:
                    results["path, Postgres"] = run_service(args, path, prompts, outputs, url, broker)
                finally:
                    drop()
    # NOTE: the engine runs again last, so a load change on a shared machine shows up as a
    # gap between the two engine rows; the ratio uses their mean.
    results["engine alone (again)"] = run_engine(args, path, prompts, outputs)
    first, again = results["engine alone"], results["engine alone (again)"]
    base = {"tok_s": (first["tok_s"] + again["tok_s"]) / 2, "token_ids": first["token_ids"]}
    headers = ("system", "wall s", "output tokens", "output tok/s", "vs engine",
               "p50 submit->row s", "p99 submit->row s", "engine-thread CPU s", "same tokens")
    rows = []
    for name, r in results.items():
        same = all(r["token_ids"].get(i) == base["token_ids"].get(i) for i in range(len(prompts)))
        rows.append((name, f"{r['wall_s']:.2f}", str(r["output_tokens"]), f"{r['tok_s']:.1f}",
                     f"{r['tok_s'] / base['tok_s']:.1%}", f"{r['p50_s']:.2f}", f"{r['p99_s']:.2f}",
                     f"{r['engine_cpu_s']:.1f}", "yes" if same else "NO"))
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]
    print("\nWhole path vs engine alone (issue 3 workload)")
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)))
    print("(engine alone: latency = add_request -> final output; path: submit -> final row; "
          "'vs engine' = output tok/s over the mean of the two engine-alone runs; engine-thread "
          "CPU = CPU seconds of the thread that steps the engine (the worker's does no Kafka or JSON "
          "work): wall time on a shared box moves with other load, this does not)")
    if args.json:
        out = {k: {kk: vv for kk, vv in v.items() if kk != "token_ids"} for k, v in results.items()}
        pathlib.Path(args.json).write_text(json.dumps({"args": vars(args), "results": out}, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
