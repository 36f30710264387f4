"""HTTP API throughput and latency: polls and submits over loopback against Postgres.

    python benchmarks/bench_api.py [--workers 2] [--connections 32] [--seconds 10]

Setup: a throwaway Postgres database (INFLIGHT_TEST_POSTGRES_URL's server, default the
local one) migrated and filled with --rows completed requests (64-token outputs) filed
under one API key; the embedded Tansu broker for submits. The API runs as its own
process tree (`inflight api --workers N`); the load generator is this process (asyncio +
uvloop, raw HTTP/1.1 keep-alive connections, one request in flight per connection).

Measured, each for --seconds after a warm-up:
- `GET /v1/requests/{id}` on random queued ids (auth + owner check + a SELECT, grouped
  with concurrent polls), then on the 500 most recent completed ids (answered from each
  process's cache of final answers once the warm-up filled it);
- `POST /v1/requests` (insert the queued row, publish, wait for the broker's ack).
Baselines in the same run, same concurrency (threads), no HTTP: the store lookup the GET
does (`store.owner_queries.request_view`) and `Client.submit` (publish + flush), so the table shows
what HTTP and FastAPI add. Server CPU = user+system seconds of the API's process tree
over the measured window; the load average is printed before and after.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from common import ROOT, percentile, wait_api

import orjson
import psutil

from tests.pgdb import temporary_database

PG_URL = os.environ.get("INFLIGHT_TEST_POSTGRES_URL",
                        "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


def tree_cpu(proc: psutil.Process) -> float:
    """user+system CPU seconds of a process and its children (uvicorn workers)."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def self_cpu() -> float:
    t = psutil.Process().cpu_times()
    return t.user + t.system


# --- load generator ------------------------------------------------------------------

async def _connection(port: int, make: "callable", stop_at: float, record_from: float,
                      lat: list[float], statuses: Counter) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while True:
            now = time.perf_counter()
            if now >= stop_at:
                return
            writer.write(make())
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            if length:
                await reader.readexactly(length)
            end = time.perf_counter()
            if now >= record_from:
                lat.append(end - now)
                statuses[status] += 1
    finally:
        writer.close()


def run_load(port: int, make: "callable", connections: int, seconds: float,
             warmup: float, server: psutil.Process
             ) -> tuple[list[float], Counter, float, float, float]:
    """(latencies of the measured window, status counts, measured seconds, server CPU
    seconds and load-generator CPU seconds in the measured window)."""
    import uvloop

    lat: list[float] = []
    statuses: Counter = Counter()
    cpu: dict[str, float] = {}

    def snapshot(when: str) -> None:
        cpu[when + "_server"], cpu[when + "_me"] = tree_cpu(server), self_cpu()

    async def main() -> None:
        start = time.perf_counter()
        loop = asyncio.get_running_loop()
        loop.call_later(warmup, snapshot, "start")
        loop.call_later(warmup + seconds, snapshot, "end")
        await asyncio.gather(*[_connection(port, make, start + warmup + seconds, start + warmup,
                                           lat, statuses) for _ in range(connections)])

    uvloop.run(main())
    if "end" + "_server" not in cpu:
        snapshot("end")
    return (lat, statuses, seconds, cpu["end_server"] - cpu["start_server"],
            cpu["end_me"] - cpu["start_me"])


def http_get(path: str, token: str) -> bytes:
    return (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\r\n"
            ).encode()


def http_post(path: str, token: str, body: bytes) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode() + body


# --- baselines (no HTTP) -----------------------------------------------------------------

def threaded(fn: "callable", threads: int, seconds: float) -> tuple[list[float], float]:
    lat: list[float] = []
    stop_at = time.perf_counter() + seconds

    def loop() -> None:
        mine = []
        while time.perf_counter() < stop_at:
            t0 = time.perf_counter()
            fn()
            mine.append(time.perf_counter() - t0)
        lat.extend(mine)

    with ThreadPoolExecutor(threads) as pool:
        for f in [pool.submit(loop) for _ in range(threads)]:
            f.result()
    return lat, seconds


# --- setup ---------------------------------------------------------------------------

def fill(store, owner: str, rows: int, final: bool) -> list[str]:
    """`rows` requests filed under `owner`: completed (64-token outputs) or still queued."""
    from inflight.schemas import FinalEvent, InferenceRequest, Timings, Usage
    from inflight.store import final_row, queued_row

    rng = random.Random(0)
    ids = []
    batch = []
    now = time.time()
    for i in range(rows):
        rid = f"bench-{'f' if final else 'q'}-{i:07d}"
        ids.append(rid)
        req = InferenceRequest(request_id=rid, prompt="What is a KV cache? " * 4,
                               submitted_at=now)
        toks = [rng.randrange(100, 49000) for _ in range(64)]
        fin = FinalEvent(request_id=rid, text="A KV cache keeps keys and values. " * 8,
                         token_ids=toks, finish_reason="length",
                         usage=Usage(prompt_tokens=24, completion_tokens=64),
                         timings=Timings(submitted_at=now, finished_at=now + 1.0), worker="w0")
        batch.append(queued_row(req) | {"owner": owner})
        if final:
            batch.append(final_row(fin))
        if len(batch) >= 2000:
            store.upsert_requests(batch)
            batch = []
    if batch:
        store.upsert_requests(batch)
    return ids


def row(name: str, lat: list[float], seconds: float, server_cpu: float | None,
        client_cpu: float | None, ok: int) -> list[str]:
    ms = [x * 1000 for x in lat]
    rate = ok / seconds
    return [name, f"{rate:,.0f}", f"{percentile(ms, 50):.1f}", f"{percentile(ms, 99):.1f}",
            "-" if server_cpu is None else f"{server_cpu:.1f}",
            "-" if server_cpu is None else f"{server_cpu / max(ok, 1) * 1e6:.0f}",
            "-" if client_cpu is None else f"{client_cpu:.1f}"]


def main() -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2, help="uvicorn worker processes")
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--json", metavar="PATH", help="write the figures as JSON")
    args = p.parse_args()

    from inflight.api.keys import create_key
    from inflight.cli.broker import EmbeddedBroker
    from inflight.cli.topics import create_topics
    from inflight.producers import Client
    from inflight.schemas import Settings
    from inflight.store import Store
    from inflight.store.owner_queries import request_view
    from tests.api.server import free_port

    results: dict = {"load_before": os.getloadavg()}
    table: list[list[str]] = []
    with temporary_database(PG_URL, "inflight_bench_") as db_url, \
            EmbeddedBroker() as broker:
        store = Store(db_url, create=True)
        key = create_key(store, "bench")
        t0 = time.monotonic()
        ids = fill(store, key.info.owner, args.rows, final=True)
        queued = fill(store, key.info.owner, args.rows, final=False)
        print(f"setup: {len(ids):,} completed + {len(queued):,} queued rows in "
              f"{time.monotonic() - t0:.1f}s; "
              f"broker {broker.bootstrap}", flush=True)
        tag = uuid.uuid4().hex[:6]
        settings = Settings(kafka_bootstrap=broker.bootstrap, database_url=db_url,
                            topic_requests=f"b{tag}.requests",
                            topic_requests_batch=f"b{tag}.requests.batch",
                            topic_results=f"b{tag}.results", topic_dlq=f"b{tag}.dlq",
                            topic_cancel=f"b{tag}.cancel", metrics_interval_s=0)
        create_topics(settings, partitions=4)
        port = free_port()
        env = {**os.environ, "PYTHONPATH": str(ROOT), "INFLIGHT_DATABASE_URL": db_url,
               "INFLIGHT_KAFKA_BOOTSTRAP": broker.bootstrap, "INFLIGHT_METRICS_INTERVAL_S": "0",
               **{f"INFLIGHT_{k.upper()}": getattr(settings, k) for k in
                  ("topic_requests", "topic_requests_batch", "topic_results", "topic_dlq",
                   "topic_cancel")}}
        proc = subprocess.Popen([sys.executable, "-m", "inflight", "api", "--port", str(port),
                                 "--workers", str(args.workers)], env=env, cwd=str(ROOT))
        server = psutil.Process(proc.pid)
        try:
            wait_api(f"http://127.0.0.1:{port}", proc, 60.0)
            rng = random.Random(1)

            # GET /v1/requests/{id}: unfinished rows (every poll reads Postgres), then
            # finished ones (served from each process's cache of final answers)
            # (the cached pool is the 500 most recent: what pipelines poll; it fills the
            # caches of both processes during the warm-up)
            for name, pool in (("queued: each poll reads Postgres", queued),
                               ("completed: cached final answers", ids[-500:])):
                def make_get(pool=pool) -> bytes:
                    return http_get(f"/v1/requests/{rng.choice(pool)}", key.token)

                lat, st, secs, cpu, me = run_load(port, make_get, args.connections,
                                                  args.seconds, args.warmup, server)
                ok = st.get(200, 0)
                table.append(row(f"GET /v1/requests/{{id}}, {name}", lat, secs, cpu, me, ok))
                results["get " + name.split(":")[0]] = {
                    "rate": ok / secs, "p50_ms": percentile(lat, 50) * 1e3,
                    "p99_ms": percentile(lat, 99) * 1e3, "server_cpu_s": cpu,
                    "statuses": dict(st)}

            # POST /v1/requests
            def make_post() -> bytes:
                body = orjson.dumps({"request_id": "p-" + uuid.uuid4().hex,
                                     "prompt": "What is a KV cache?",
                                     "params": {"max_tokens": 16}})
                return http_post("/v1/requests", key.token, body)

            lat, st, secs, cpu, me = run_load(port, make_post, args.connections, args.seconds,
                                              args.warmup, server)
            ok = st.get(202, 0)
            table.append(row("POST /v1/requests", lat, secs, cpu, me, ok))
            results["post"] = {"rate": ok / secs, "p50_ms": percentile(lat, 50) * 1e3,
                               "p99_ms": percentile(lat, 99) * 1e3, "server_cpu_s": cpu,
                               "statuses": dict(st)}
        finally:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(30)
            if proc.poll() is None:
                proc.kill()

        # baselines: the same work without HTTP, threads = connections
        me0 = self_cpu()
        lat, secs = threaded(lambda: request_view(store, random.choice(queued)),
                             min(args.connections, 16), args.seconds)
        table.append(row("baseline: store lookup, no HTTP", lat, secs, None, self_cpu() - me0,
                         len(lat)))
        results["baseline_get"] = {"rate": len(lat) / secs}
        client = Client(settings, store=store)
        local = threading.local()

        def submit_one() -> None:
            client.submit("What is a KV cache?", {"max_tokens": 16},
                          request_id="c-" + uuid.uuid4().hex)
            local.n = getattr(local, "n", 0) + 1

        me0 = self_cpu()
        lat, secs = threaded(submit_one, min(args.connections, 16), args.seconds)
        table.append(row("baseline: Client.submit, no HTTP", lat, secs, None, self_cpu() - me0,
                         len(lat)))
        results["baseline_post"] = {"rate": len(lat) / secs}
        client.close()
        store.close()

    results["load_after"] = os.getloadavg()
    head = ["", "per s", "p50 ms", "p99 ms", "server CPU s", "server CPU µs/req",
            "load-gen CPU s"]
    widths = [max(len(r[i]) for r in [head, *table]) for i in range(len(head))]
    print()
    for r in [head, ["-" * w for w in widths], *table]:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |")
    print(f"\n{args.workers} API worker processes, {args.connections} connections, {args.seconds:.0f}s measured after "
          f"{args.warmup:.0f}s warm-up, {os.cpu_count()} CPUs (shared); targets: GET >= 1,000/s "
          "with p99 <= 50 ms, POST >= 500/s")
    print("load average (1/5/15 min) before: {:.2f} {:.2f} {:.2f}; after: {:.2f} {:.2f} {:.2f}"
          .format(*results["load_before"], *results["load_after"]))
    if args.json:
        with open(args.json, "wb") as f:
            f.write(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
