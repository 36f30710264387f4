"""`benchmarks/service.py --engine synthetic`: the delivery path's own capacity, no model.

Each version of the worker runs as its own process on benchmarks/synthetic_engine.py (up to
--concurrency requests at once, --step-ms per step, one token per request per step), with
the recorder as its own process, the embedded broker and a fresh Postgres database:

    before  the worker and recorder of commit f1e85d1 (checked out into a temp dir with
            `git archive`): one token event per token on inflight.results, sent from the
            thread that steps the engine
    after   this tree: intake / engine loop / publisher threads, coalesced deltas on
            inflight.results.tokens, status + finals on inflight.results

Requests are produced as raw JSON (both versions' schema) by a librdkafka producer. Phases, in
order, on one running worker + recorder (after a warm-up request through the whole path):

    stream   --stream-requests requests of --stream-tokens tokens, produced at once:
             streamed tokens/s = tokens / (first produce -> last final row committed)
    finals   --final-requests requests of --final-tokens tokens, produced at once:
             finals/s recorded in Postgres, same window
    latency  --latency-rate requests/s for --latency-seconds, --stream-tokens each:
             p50 / p99 submit -> final row

Nothing lost: every request of every phase must end `completed`, and the stream phase's
token events must add up to every request's tokens. CPU seconds per 1,000 tokens are the
worker's and the recorder's process CPU (all threads) over the stream phase.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict

ROOT = pathlib.Path(__file__).resolve().parents[1]
BEFORE_COMMIT = "f1e85d1"


def add_arguments(p) -> None:
    g = p.add_argument_group("--engine synthetic")
    g.add_argument("--concurrency", type=int, default=256, help="requests in the engine at once")
    g.add_argument("--step-ms", type=float, default=1.0, help="synthetic step time (a GPU's)")
    g.add_argument("--stream-requests", type=int, default=4096)
    g.add_argument("--stream-tokens", type=int, default=64)
    g.add_argument("--final-requests", type=int, default=8192)
    g.add_argument("--final-tokens", type=int, default=2)
    g.add_argument("--latency-rate", type=float, default=200.0, help="requests/s")
    g.add_argument("--latency-seconds", type=float, default=10.0)
    g.add_argument("--before", default=BEFORE_COMMIT, help="commit of the 'before' worker")
    g.add_argument("--skip-before", action="store_true")
    g.add_argument("--skip-token-check", action="store_true",
                   help="do not read every token event back (slow for the 'before' worker)")


def checkout(commit: str, dest: pathlib.Path) -> pathlib.Path:
    """The tree of `commit` in `dest` (git archive: no worktree metadata to clean up)."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def raw_request(rid: str, tokens: int) -> bytes:
    """A request both versions accept (no field newer than commit f1e85d1)."""
    import orjson

    return orjson.dumps({"request_id": rid, "prompt_token_ids": list(range(100, 116)),
                         "params": {"max_tokens": tokens, "temperature": 0.0,
                                    "ignore_eos": True},
                         "submitted_at": time.time()})


class Rows:
    """Final rows of one phase (ids share a prefix), read from the store."""

    def __init__(self, store):
        self.store = store

    def fetch(self, prefix: str) -> list:
        from sqlalchemy import select

        from inflight.store import RequestRow

        with self.store.session() as s:
            return s.execute(select(RequestRow.id, RequestRow.status, RequestRow.created_at,
                                    RequestRow.updated_at, RequestRow.output_token_ids)
                             .where(RequestRow.id.like(prefix + "%"))).all()

    def done(self, prefix: str) -> int:
        from sqlalchemy import func, select

        from inflight.store import RequestRow

        with self.store.session() as s:
            return s.execute(select(func.count()).where(
                RequestRow.id.like(prefix + "%"),
                RequestRow.status.in_(("completed", "failed", "cancelled")))).scalar_one()

    def wait(self, prefix: str, n: int, timeout: float) -> list:
        """NOTE: counts while waiting (fetching every row every 0.1 s cost Postgres and this
        process more CPU than the recorder's writes), fetches the rows once at the end."""
        deadline = time.monotonic() + timeout
        while True:
            if self.done(prefix) >= n:
                return self.fetch(prefix)
            if time.monotonic() > deadline:
                rows = self.fetch(prefix)
                counts = defaultdict(int)
                for r in rows:
                    counts[r.status] += 1
                raise RuntimeError(f"{prefix}: only {dict(counts)} of {n} after {timeout:.0f}s")
            time.sleep(0.1)


def _cpu(proc) -> float:
    import psutil

    t = psutil.Process(proc.pid).cpu_times()
    return t.user + t.system


def _pg_cpu(database: str) -> float:
    """CPU seconds of the Postgres backends connected to `database` (their process titles
    name it; a backend that exited meanwhile drops out, the recorder's stays)."""
    import psutil

    total = 0.0
    for proc in psutil.process_iter(["cmdline"]):
        if any(database in part for part in proc.info["cmdline"] or ()):
            try:
                t = proc.cpu_times()
            except psutil.Error:
                continue
            total += t.user + t.system
    return total


def _report(path: pathlib.Path) -> dict:
    for _ in range(50):
        try:
            return json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            time.sleep(0.1)
    raise RuntimeError(f"the worker wrote no report to {path}")


def _thread_delta(a: dict, b: dict) -> dict[str, float]:
    """CPU seconds per worker thread between two reports (older workers report none)."""
    ta, tb = a.get("threads") or {}, b.get("threads") or {}
    return {k: round(v - ta.get(k, 0.0), 3) for k, v in tb.items() if v - ta.get(k, 0.0) > 0.005}


def _fmt_threads(d: dict[str, float]) -> str:
    return "(" + ", ".join(f"{k} {v:.2f}" for k, v in sorted(d.items(), key=lambda kv: -kv[1])) + ")"


def count_tokens(settings, topic: str, ids: set[str], timeout: float = 300.0) -> dict[str, int]:
    """Output tokens per request id in the token events of `topic` (all partitions)."""
    import orjson
    from kafka import TopicPartition

    from inflight.transport.kafka_clients import partitions_of, plain_consumer

    c = plain_consumer(settings, fetch_max_bytes=16 << 20, max_partition_fetch_bytes=8 << 20)
    counts: dict[str, int] = defaultdict(int)
    try:
        tps = [TopicPartition(topic, p) for p in partitions_of(c, topic)]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        deadline, idle = time.monotonic() + timeout, 0
        while time.monotonic() < deadline and idle < 5:
            got = c.poll(timeout_ms=300, max_records=50_000)
            idle = 0 if got else idle + 1
            for recs in got.values():
                for r in recs:
                    if r.key and b'"type":"token"' in r.value[:20]:
                        rid = r.key.decode()
                        if rid in ids:
                            counts[rid] += len(orjson.loads(r.value)["token_ids"])
    finally:
        c.close()
    return counts


def run_version(label: str, tree: pathlib.Path, args, broker, pg_url: str) -> dict:
    from inflight.cli.commands import settings_env
    from inflight.cli.topics import create_topics
    from inflight.schemas import Settings
    from inflight.store import Store

    tag = uuid.uuid4().hex[:8]
    s = Settings(kafka_bootstrap=broker.bootstrap, kafka_session_timeout_ms=2000,
                 kafka_heartbeat_interval_ms=500, topic_requests=f"s{tag}.requests",
                 topic_requests_batch=f"s{tag}.requests.batch", topic_results=f"s{tag}.results",
                 topic_results_tokens=f"s{tag}.results.tokens", topic_dlq=f"s{tag}.dlq",
                 topic_cancel=f"s{tag}.cancel", worker_group=f"s{tag}-workers",
                 recorder_group=f"s{tag}-recorder", database_url=pg_url,
                 worker_max_inflight=args.concurrency, metrics_interval_s=0.0)
    create_topics(s, partitions=args.partitions)
    store = Store(pg_url, create=True)
    db_name = pg_url.rsplit("/", 1)[-1]
    rows = Rows(store)
    env = {**os.environ, **settings_env(s), "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    report_path = pathlib.Path(tempfile.mkdtemp(prefix="inflight-bench-")) / "worker.json"
    log = open(report_path.with_suffix(".log"), "wb")
    recorder = subprocess.Popen([sys.executable, "-m", "inflight", "recorder"], cwd=tree, env=env,
                                stdout=log, stderr=subprocess.STDOUT)
    worker = subprocess.Popen(
        [sys.executable, str(ROOT / "benchmarks" / "synthetic_worker.py"), "--report",
         str(report_path), "--max-num-seqs", str(args.concurrency), "--step-ms",
         str(args.step_ms)], cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT)
    # NOTE: the load comes from librdkafka (little CPU a request): kafka-python's producer
    # took a noticeable share of a small box's CPU, away from the path measured
    from confluent_kafka import Producer

    prod = Producer({**s.rdkafka_common(), "linger.ms": 5, "acks": "all"})
    out: dict = {"label": label}

    def produce(prefix: str, n: int, tokens: int) -> list[str]:
        ids = [f"{prefix}{i}" for i in range(n)]
        for rid in ids:
            prod.produce(s.topic_requests, raw_request(rid, tokens), rid.encode())
        if prod.flush(60):
            raise RuntimeError("requests not delivered to the broker within 60s")
        return ids

    try:
        produce(f"{tag}-warm-", 1, 2)
        rows.wait(f"{tag}-warm-", 1, 120)

        # -- stream capacity -------------------------------------------------------------
        rep0, cpu_r = _report(report_path), _cpu(recorder)
        cpu_b, cpu_pg = _cpu(broker.proc), _pg_cpu(db_name)
        cpu_w = rep0["cpu_s"]
        t0 = time.time()
        ids = produce(f"{tag}-s-", args.stream_requests, args.stream_tokens)
        got = rows.wait(f"{tag}-s-", len(ids), args.timeout)
        end = max(r.updated_at.timestamp() for r in got)
        time.sleep(0.4)  # the worker's next report
        tokens = args.stream_requests * args.stream_tokens
        rep1 = _report(report_path)
        dw, dr = rep1["cpu_s"] - cpu_w, _cpu(recorder) - cpu_r
        db, dpg = _cpu(broker.proc) - cpu_b, _pg_cpu(db_name) - cpu_pg
        out.update(stream_s=end - t0, tok_s=tokens / (end - t0),
                   stream_lost=sum(r.status != "completed"
                                   or len(r.output_token_ids or []) != args.stream_tokens
                                   for r in got),
                   worker_cpu_per_1k=dw / tokens * 1000, recorder_cpu_per_1k=dr / tokens * 1000,
                   worker_cpu_s=dw, recorder_cpu_s=dr,
                   stream_threads_cpu_s=_thread_delta(rep0, rep1), stream_broker_cpu_s=db,
                   stream_postgres_cpu_s=dpg)
        out["stream_engine_done_s"] = rep1["last_finish"] - t0
        out["stream_engine_steps"] = rep1["steps"] - rep0["steps"]
        print(f"  {label}: stream {tokens} tokens in {end - t0:.2f}s (the engine's last at "
              f"{rep1['last_finish'] - t0:.2f}s, {out['stream_engine_steps']} steps); "
              f"CPU s worker {dw:.2f} "
              f"{_fmt_threads(out['stream_threads_cpu_s'])}, recorder {dr:.2f}, broker "
              f"{db:.2f}, Postgres {dpg:.2f}", flush=True)

        # -- finals capacity ---------------------------------------------------------------
        rep0, cpu_r = _report(report_path), _cpu(recorder)
        cpu_b, cpu_pg = _cpu(broker.proc), _pg_cpu(db_name)
        t0 = time.time()
        fids = produce(f"{tag}-f-", args.final_requests, args.final_tokens)
        got = rows.wait(f"{tag}-f-", len(fids), args.timeout)
        end = max(r.updated_at.timestamp() for r in got)
        time.sleep(0.4)  # the worker's next report
        rep1 = _report(report_path)
        dw, dr = rep1["cpu_s"] - rep0["cpu_s"], _cpu(recorder) - cpu_r
        db, dpg = _cpu(broker.proc) - cpu_b, _pg_cpu(db_name) - cpu_pg
        out.update(finals_s=len(fids) / (end - t0), finals_window_s=end - t0,
                   finals_lost=sum(r.status != "completed" for r in got),
                   finals_worker_cpu_ms_per_request=dw / len(fids) * 1000,
                   finals_recorder_cpu_ms_per_request=dr / len(fids) * 1000,
                   finals_threads_cpu_s=_thread_delta(rep0, rep1), finals_broker_cpu_s=db,
                   finals_postgres_cpu_s=dpg)
        out["finals_engine_done_s"] = rep1["last_finish"] - t0
        print(f"  {label}: {len(fids)} finals in {end - t0:.2f}s (the engine's last at "
              f"{rep1['last_finish'] - t0:.2f}s); CPU s worker {dw:.2f} "
              f"{_fmt_threads(out['finals_threads_cpu_s'])}, recorder {dr:.2f}, broker "
              f"{db:.2f}, Postgres {dpg:.2f}", flush=True)

        # -- latency at a steady rate ------------------------------------------------------
        n = int(args.latency_rate * args.latency_seconds)
        t0 = time.monotonic()
        for i in range(n):
            delay = t0 + i / args.latency_rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            rid = f"{tag}-l-{i}"
            prod.produce(s.topic_requests, raw_request(rid, args.stream_tokens), rid.encode())
            prod.poll(0)
        prod.flush(60)
        got = rows.wait(f"{tag}-l-", n, args.timeout)
        lat = sorted(r.updated_at.timestamp() - r.created_at.timestamp() for r in got)
        from common import percentile

        out.update(p50_s=percentile(lat, 50), p99_s=percentile(lat, 99),
                   latency_lost=sum(r.status != "completed" for r in got))
        print(f"  {label}: latency p50 {out['p50_s']:.3f}s p99 {out['p99_s']:.3f}s", flush=True)

        if not args.skip_token_check:
            # token events: on inflight.results.tokens since the threaded worker, on
            # inflight.results before (f1e85d1); a worker uses one of the two
            counts = count_tokens(s, s.topic_results_tokens, set(ids))
            if not counts:
                counts = count_tokens(s, s.topic_results, set(ids))
            out["tokens_missing"] = sum(max(args.stream_tokens - counts.get(rid, 0), 0)
                                        for rid in ids)
    finally:
        for proc in (worker, recorder):
            proc.terminate()
        for proc in (worker, recorder):
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        prod.flush(10)
        store.close()
        log.close()
    return out


def engine_alone(args) -> dict:
    """The synthetic engine stepped in a loop, outputs dropped: the ceiling of the path."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from synthetic_engine import SyntheticEngine

    eng = SyntheticEngine(max_num_seqs=args.concurrency, step_s=args.step_ms / 1000)

    class P:
        max_tokens = args.stream_tokens

    t0 = time.perf_counter()
    for i in range(args.stream_requests):
        eng.add_request(f"e{i}", params=P)
    while eng.has_unfinished():
        eng.step()
    wall = time.perf_counter() - t0
    return {"label": "engine alone", "tok_s": eng.tokens / wall, "stream_s": wall}


def main(args) -> None:
    import logging

    from inflight.cli.broker import EmbeddedBroker
    from common import postgres_database

    logging.basicConfig(level=logging.WARNING)
    print(f"synthetic engine: {args.concurrency} at once, {args.step_ms} ms a step; stream "
          f"{args.stream_requests} x {args.stream_tokens} tokens, finals {args.final_requests} x "
          f"{args.final_tokens}, latency {args.latency_rate:.0f}/s for {args.latency_seconds:.0f}s;"
          f" {os.cpu_count()} CPUs", flush=True)
    results = [engine_alone(args)]
    with tempfile.TemporaryDirectory(prefix="inflight-bench-") as tmp, \
            EmbeddedBroker(log_path=pathlib.Path(tmp) / "tansu.log") as broker:
        versions = [] if args.skip_before else [
            (f"before ({args.before})", checkout(args.before, pathlib.Path(tmp) / "before"))]
        versions.append(("after", ROOT))
        for label, tree in versions:
            url, drop = postgres_database(args.postgres_url)
            if url is None:
                raise SystemExit("--engine synthetic needs Postgres (--postgres-url)")
            try:
                results.append(run_version(label.split(" ")[0], tree, args, broker, url))
                results[-1]["label"] = label
            finally:
                drop()
    print_table(results, args)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"args": vars(args), "results": results},
                                                      indent=2, default=str))
        print(f"wrote {args.json}")


def print_table(results: list[dict], args) -> None:
    headers = ("system", "streamed tok/s", "finals/s (Postgres)", "p50 submit->row s",
               "p99 submit->row s", "worker CPU s / 1k tok", "recorder CPU s / 1k tok", "lost")

    def f(r, key, fmt):
        return fmt.format(r[key]) if key in r else "-"

    rows = []
    for r in results:
        lost = sum(r.get(k, 0) for k in ("stream_lost", "finals_lost", "latency_lost",
                                         "tokens_missing"))
        rows.append((r["label"], f(r, "tok_s", "{:,.0f}"), f(r, "finals_s", "{:,.0f}"),
                     f(r, "p50_s", "{:.3f}"), f(r, "p99_s", "{:.3f}"),
                     f(r, "worker_cpu_per_1k", "{:.3f}"), f(r, "recorder_cpu_per_1k", "{:.3f}"),
                     "-" if r["label"] == "engine alone" else str(lost)))
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]
    print("\nDelivery path capacity, synthetic engine (Postgres store)")
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)))
    print("(streamed tok/s: stream-phase tokens / first produce -> last final row; finals/s: "
          f"{args.final_tokens}-token requests, same window; latency at "
          f"{args.latency_rate:.0f} requests/s; lost: requests not completed + token events "
          "missing; CPU: process CPU over the stream phase, all threads)")
