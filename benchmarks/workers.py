"""Scale-out: the whole service path with 1 worker vs 2 workers in one consumer group.

    .venv/bin/python benchmarks/workers.py [--workers 1,2] [--num-requests 96] [--plot out.png]

Everything real and deployed as processes: the embedded broker (Tansu), N worker processes
(`inflight worker`, one torch thread each: one "GPU" each), the
recorder process, SQLite (or --database-url). The model is a small random Llama written
for the run (no download; --model PATH to use a real folder). The workload is the same for every N:
greedy, ignore_eos, prompt and output lengths drawn once from --seed.

Before the clock starts, warm-up requests go through the path until every worker has
finished one (group settled, models loaded). Wall time runs from the first submit to the
last final row's commit (`updated_at`). Worker CPU seconds come from /proc (utime + stime
of the worker processes over the timed part); "cores used" = worker CPU s / wall s and the
1-minute load average show how much of the box the workers actually got (other jobs on a
shared box take the rest).
Output tokens of every request are compared across runs (they must be identical).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid

ROOT = pathlib.Path(__file__).resolve().parents[1]
for p in (str(ROOT), str(ROOT / "benchmarks")):
    if p not in sys.path:
        sys.path.insert(0, p)

from common import percentile as pct  # noqa: E402  (benchmarks/common.py)

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def workload(n: int, seed: int, vocab: int, max_prompt: int, max_tokens: int):
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(8, max_prompt))] for _ in range(n)]
    outputs = [rng.randint(max(1, max_tokens // 4), max_tokens) for _ in range(n)]
    return prompts, outputs


def run(args, n_workers: int, model: pathlib.Path, broker, prompts, outputs, workdir) -> dict:
    from inflight.cli.commands import settings_env
    from inflight.cli.topics import create_topics
    from inflight.producers.client import Client
    from inflight.schemas import SamplingParams, Settings
    from inflight.store import Store

    tag = uuid.uuid4().hex[:8]
    db_url = args.database_url or f"sqlite:///{workdir / f'{tag}.db'}"
    s = Settings(kafka_bootstrap=broker.bootstrap, kafka_session_timeout_ms=2000,
                 kafka_heartbeat_interval_ms=500, topic_requests=f"w{tag}.requests",
                 topic_requests_batch=f"w{tag}.requests.batch", topic_results=f"w{tag}.results",
                 topic_dlq=f"w{tag}.dlq", topic_cancel=f"w{tag}.cancel",
                 worker_group=f"w{tag}-workers", recorder_group=f"w{tag}-recorder",
                 database_url=db_url, worker_max_inflight=args.max_num_seqs,
                 metrics_interval_s=0.0)
    create_topics(s, partitions=args.partitions)
    store = Store(db_url, create=True)
    env = {**os.environ, **settings_env(s), "PYTHONPATH": str(ROOT),
           "OMP_NUM_THREADS": str(args.threads)}
    recorder = subprocess.Popen([sys.executable, "-m", "inflight", "recorder"], cwd=ROOT, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers = [subprocess.Popen([sys.executable, "-m", "inflight", "worker", "--model", str(model)],
                                cwd=ROOT, env=env, stdout=open(workdir / f"{tag}-w{i}.log", "wb"),
                                stderr=subprocess.STDOUT) for i in range(n_workers)]
    names = {f"{os.uname().nodename}:{w.pid}" for w in workers}
    client = Client(s)
    try:
        params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
        warm: list[str] = []
        deadline = time.monotonic() + 180
        while True:  # warm-up until every worker has finished a request
            warm += [client.submit({"prompt_token_ids": [5 + i % 50, 6, 7]}, params)
                     for i in range(len(warm), len(warm) + 2 * args.partitions)]
            time.sleep(1.0)
            done = {r.worker for r in store.get_requests(warm).values() if r.status == "completed"}
            if names <= done:
                break
            if time.monotonic() > deadline or any(w.poll() is not None for w in workers):
                raise RuntimeError(f"warm-up: workers {names - done} never finished a request")
        while store.count_by_status()["completed"] < len(warm):
            time.sleep(0.1)
        cpu0 = sum(cpu_seconds(w.pid) for w in workers)
        load0 = os.getloadavg()[0]
        ids = [f"bench-{tag}-{i}" for i in range(len(prompts))]
        t0 = time.time()
        for rid, p, m in zip(ids, prompts, outputs):
            client.submit({"prompt_token_ids": p},
                          SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True),
                          request_id=rid, flush=False)
        client.flush()
        deadline = time.monotonic() + args.timeout
        while True:
            rows = store.get_requests(ids)
            if sum(r.status in ("completed", "failed") for r in rows.values()) == len(ids):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {args.timeout}s")
            time.sleep(0.1)
        cpu1 = sum(cpu_seconds(w.pid) for w in workers)
        done_at = {rid: r.updated_at.timestamp() for rid, r in rows.items()}
        wall = max(done_at.values()) - t0
        tokens = sum(len(r.output_token_ids or []) for r in rows.values())
        lat = [done_at[rid] - rows[rid].created_at.timestamp() for rid in ids]
        per_worker: dict[str, int] = {}
        for r in rows.values():
            per_worker[r.worker] = per_worker.get(r.worker, 0) + 1
        return {"workers": n_workers, "wall_s": wall, "output_tokens": tokens,
                "load_avg": (load0 + os.getloadavg()[0]) / 2,
                "tok_s": tokens / wall, "worker_cpu_s": cpu1 - cpu0,
                "p50_s": pct(lat, 50), "p99_s": pct(lat, 99),
                "failed": sum(r.status != "completed" for r in rows.values()),
                "per_worker": sorted(per_worker.values(), reverse=True),
                "token_ids": [rows[rid].output_token_ids for rid in ids]}
    finally:
        client.close()
        for proc in workers + [recorder]:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in workers + [recorder]:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="1,2", help="worker counts to compare (comma-separated)")
    ap.add_argument("--num-requests", type=int, default=96)
    ap.add_argument("--max-tokens", type=int, default=96, help="outputs uniform in [max/4, max]")
    ap.add_argument("--max-prompt", type=int, default=64)
    ap.add_argument("--max-num-seqs", type=int, default=16, help="per worker (its in-flight limit)")
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    ap.add_argument("--hidden", type=int, default=256, help="hidden size of the random model")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--model", default=None, help="a HF folder instead of the random model")
    ap.add_argument("--database-url", default=None, help="default: a SQLite file per run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--plot", metavar="PATH")
    args = ap.parse_args()

    from inflight.cli.broker import EmbeddedBroker

    counts = [int(x) for x in args.workers.split(",")]
    with tempfile.TemporaryDirectory(prefix="inflight-workers-") as tmp:
        workdir = pathlib.Path(tmp)
        if args.model:
            model, vocab = pathlib.Path(args.model), 2000
        else:
            from tests.tiny_llama import write_tiny_llama

            model = write_tiny_llama(workdir / "model", hidden_size=args.hidden,
                                     num_layers=args.layers, num_heads=8, num_kv_heads=2)
            vocab = 320
        prompts, outputs = workload(args.num_requests, args.seed, vocab, args.max_prompt,
                                    args.max_tokens)
        broker = EmbeddedBroker()
        broker.start()
        try:
            results = []
            for n in counts:
                print(f"running {n} worker(s) ...", flush=True)
                results.append(run(args, n, model, broker, prompts, outputs, workdir))
        finally:
            broker.stop()

    base = results[0]
    same = all(r["token_ids"] == base["token_ids"] for r in results)
    print(f"\n{args.num_requests} requests, outputs {args.max_tokens // 4}-{args.max_tokens} tokens, "
          f"{args.partitions} partitions, model "
          f"{args.model or f'random Llama h={args.hidden} L={args.layers}'}, "
          f"{args.threads} torch thread(s) per worker, {os.cpu_count()} CPUs\n")
    print("| workers | output tokens | wall s | output tok/s | speed-up | worker CPU s | cores used "
          "| tok / CPU s | p50 / p99 submit->row s | requests per worker | box load avg |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(f"| {r['workers']} | {r['output_tokens']} | {r['wall_s']:.1f} | {r['tok_s']:.1f} | "
              f"{r['tok_s'] / base['tok_s']:.2f}x | {r['worker_cpu_s']:.1f} | "
              f"{r['worker_cpu_s'] / r['wall_s']:.2f} | "
              f"{r['output_tokens'] / max(r['worker_cpu_s'], 1e-9):.1f} | "
              f"{r['p50_s']:.1f} / {r['p99_s']:.1f} | {r['per_worker']} | {r['load_avg']:.1f} |")
    failed = sum(r["failed"] for r in results)
    if failed:
        print(f"\n{failed} requests failed")
    print(f"\noutput tokens identical across runs: {'yes' if same else 'NO'}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(
            [{k: v for k, v in r.items() if k != "token_ids"} for r in results], indent=2))
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.bar([str(r["workers"]) for r in results], [r["tok_s"] for r in results])
        ax.set_xlabel("workers")
        ax.set_ylabel("output tokens / s")
        ax.set_title("inflight: one consumer group, scale-out")
        fig.tight_layout()
        fig.savefig(args.plot)
    if not same or any(r["failed"] for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
