"""Many concurrent streaming chat completions against one API process: completed, refused
and cut streams, first-token latency, the API's CPU per streamed token, its memory per
open stream and its connections to the broker; before and after in one run.

    OMP_NUM_THREADS=1 python benchmarks/streams.py [--streams 100,1000,4000]
        [--max-tokens 64] [--step-ms 50] [--before PYTHON] [--json out.json]

Per version (this checkout; `--before PYTHON`: also the interpreter of another checkout,
e.g. a worktree of main before the change with its own editable install) and per C:
- one worker on the synthetic engine (benchmarks/synthetic_engine.py: every running
  request gets a token per `--step-ms` step; a real model on this CPU cannot feed
  thousands of streams in reasonable time), `max_num_seqs` = the largest C, so requests
  wait in the worker only while it admits them; the recorder; one API process started
  fresh for each C (`inflight api`); the embedded broker (memory storage), SQLite;
- C streamed `POST /v1/chat/completions` (`--max-tokens` tokens, include_usage) opened at
  once from this process (asyncio, raw HTTP/1.1, one connection each, opened at most
  `--connect-rate` a second so the listen backlog never overflows);
- completed: the finish chunk and [DONE] came; refused: an HTTP error (503: the old
  64-stream cap); cut: the stream ended or broke before its finish chunk;
- first token: request sent -> first content chunk, p50/p99; "in the worker" is the same
  request's submit -> first token at the worker's engine (the store's timings): queueing
  in the worker, not the API's; and the rest of it: "into the API" (sent -> the request
  filed by the API) and "out" (the worker's first token -> this process has it);
- API CPU per streamed token: user+system seconds of the API process from the first
  request to the last stream's end, over the completion tokens delivered (usage);
- API RSS: before the streams and at its peak; per open stream = (RSS - before) / streams
  open, at the sample with the most streams open (streams this process has answered and
  not ended; the API's own /metrics gauge of its follows is shown too, but under load its
  answers come late and miss the peak). Streams are open at once only if they outlast
  the ramp (C / what the API accepts a second): `--step-ms 1000` keeps them open;
- broker connections: the API process's TCP connections to the broker at the peak (a
  Kafka consumer holds at least one; before: one consumer per open stream).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import time
import uuid

ROOT = pathlib.Path(__file__).resolve().parents[1]
for p in (str(ROOT), str(ROOT / "benchmarks")):
    if p not in sys.path:
        sys.path.insert(0, p)

from common import explicit_env, percentile as pct, process_cpu, wait_api  # noqa: E402

import orjson  # noqa: E402
import psutil  # noqa: E402


# --- the load generator ------------------------------------------------------------------

RECORDER_WAIT_S = 20.0
OPEN = [0]   # streams of this process answered 200 and not ended yet (the Sampler reads it)


async def one_stream(port: int, token: str, max_tokens: int, out: dict) -> None:
    body = orjson.dumps({"model": "default", "max_tokens": max_tokens, "stream": True,
                         "messages": [{"role": "user", "content": "hi"}],
                         "stream_options": {"include_usage": True}})
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
            f"{token}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode()
    t0 = time.time()
    out.update(sent=t0, status=None, first=None, finished=False, done=False, tokens=0)
    counted = False
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
    except OSError as exc:
        out["error"] = f"connect: {exc}"
        return
    try:
        writer.write(head + body)
        status_line = await reader.readline()
        out["status"] = int(status_line.split()[1])
        headers = (await reader.readuntil(b"\r\n\r\n")).lower()
        if out["status"] != 200:
            return
        OPEN[0] += 1
        counted = True
        if b"transfer-encoding: chunked" not in headers:
            out["error"] = "not chunked"
            return
        while True:
            size = int((await reader.readline()).strip() or b"0", 16)
            if size == 0:
                break
            data = await reader.readexactly(size + 2)
            for frame in data[:-2].split(b"\n\n"):
                if not frame.startswith(b"data: "):
                    continue
                if frame == b"data: [DONE]":
                    out["done"] = True
                    continue
                if out["first"] is None and b'"content":"' in frame and \
                        b'"content":""' not in frame:
                    out["first"] = time.time()
                    out["id"] = orjson.loads(frame[6:])["id"].removeprefix("chatcmpl-")
                if b'"finish_reason":"' in frame:
                    out["finished"] = True
                if b'"usage":{' in frame and b'"choices":[]' in frame:
                    out["tokens"] = orjson.loads(frame[6:])["usage"]["completion_tokens"]
    except (OSError, asyncio.IncompleteReadError, ValueError, IndexError) as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        out["ended"] = time.time()
        if counted:
            OPEN[0] -= 1
        writer.close()


async def many_streams(port: int, token: str, n: int, max_tokens: int,
                       rate: float) -> list[dict]:
    outs: list[dict] = [{} for _ in range(n)]
    tasks = []
    for i in range(n):
        tasks.append(asyncio.create_task(one_stream(port, token, max_tokens, outs[i])))
        if rate > 0 and (i + 1) % 50 == 0:
            await asyncio.sleep(50 / rate)
    await asyncio.gather(*tasks)
    return outs


# --- sampling the API process ---------------------------------------------------------------

class Sampler:
    """The API process's RSS, open streams and broker connections, sampled. Open streams
    twice: the API's /metrics gauge (its follows; under load its answer comes late, so
    peaks are missed) and this process's streams answered and not ended (OPEN), read with
    the RSS in the same sample: memory per open stream comes from that pair."""

    def __init__(self, pid: int, port: int, broker_port: int, token: str):
        self.proc = psutil.Process(pid)
        self.port, self.broker_port, self.token = port, broker_port, token
        self.rss_peak = 0
        self.streams_peak = 0
        self.conns_peak = 0
        self.client_open_peak = 0
        self.rss_at_client_peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def metrics_open_streams(self) -> int:
        import httpx

        with contextlib.suppress(Exception):
            text = httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=2).text
            for line in text.splitlines():
                if line.startswith("inflight_api_open_streams "):
                    return int(float(line.split()[1]))
        return 0

    def broker_connections(self) -> int:
        with contextlib.suppress(psutil.Error):
            return sum(1 for c in self.proc.net_connections(kind="tcp")
                       if c.raddr and c.raddr.port == self.broker_port)
        return 0

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            with contextlib.suppress(psutil.Error):
                rss, n = self.proc.memory_info().rss, OPEN[0]
                self.rss_peak = max(self.rss_peak, rss)
                if n > self.client_open_peak:
                    self.client_open_peak, self.rss_at_client_peak = n, rss
            self.streams_peak = max(self.streams_peak, self.metrics_open_streams())
            self.conns_peak = max(self.conns_peak, self.broker_connections())

    def start(self) -> "Sampler":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def run_version(name: str, python: str, args, broker) -> list[dict]:
    from inflight.api.keys import create_key
    from inflight.cli.broker import free_port
    from inflight.cli.topics import create_topics
    from inflight.schemas import Settings
    from inflight.store import Store, upgrade

    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f"inflight-streams-{name}-"))
    tag = uuid.uuid4().hex[:8]
    db = f"sqlite:///{tmp / 'store.db'}"
    upgrade(db)
    top = max(args.streams)
    s = Settings(kafka_bootstrap=broker.bootstrap, database_url=db, metrics_interval_s=0.0,
                 topic_requests=f"s{tag}.requests", topic_requests_batch=f"s{tag}.requests.batch",
                 topic_results=f"s{tag}.results", topic_results_tokens=f"s{tag}.results.tokens",
                 topic_dlq=f"s{tag}.dlq", topic_cancel=f"s{tag}.cancel",
                 worker_group=f"s{tag}-workers", recorder_group=f"s{tag}-recorder",
                 worker_max_inflight=top, kafka_session_timeout_ms=6000,
                 kafka_heartbeat_interval_ms=1000, api_wait_timeout_s=args.timeout,
                 served_model_name="default", data_dir=tmp / "data")
    create_topics(s, partitions=args.partitions)
    env = {**os.environ, **explicit_env(s), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT / "benchmarks")}
    log = open(tmp / "procs.log", "wb")
    worker = subprocess.Popen(
        [python, str(ROOT / "benchmarks" / "synthetic_worker.py"), "--report",
         str(tmp / "worker.json"), "--max-num-seqs", str(top), "--step-ms", str(args.step_ms)],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp)
    # NOTE: cwd outside any checkout: `python -m inflight` would import ./inflight first
    recorder = subprocess.Popen([python, "-m", "inflight", "recorder"], env=env, stdout=log,
                                stderr=subprocess.STDOUT, cwd=tmp)
    store = Store(db)
    token = create_key(store, "streams").token
    broker_port = int(broker.bootstrap.rsplit(":", 1)[1])
    rows = []
    try:
        for c in args.streams:
            port = free_port()
            api = subprocess.Popen([python, "-m", "inflight", "api", "--port", str(port)],
                                   env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp)
            try:
                url = f"http://127.0.0.1:{port}"
                wait_api(url, api, 120.0, "/readyz")
                asyncio.run(many_streams(port, token, 3, args.max_tokens, 0))   # warm-up
                time.sleep(1.0)
                rss0 = psutil.Process(api.pid).memory_info().rss
                sampler = Sampler(api.pid, port, broker_port, token).start()
                cpu0, t0 = process_cpu(api.pid), time.time()
                print(f"{name}: {c} streams ...", file=sys.stderr, flush=True)
                outs = asyncio.run(many_streams(port, token, c, args.max_tokens,
                                                args.connect_rate))
                cpu1, t1 = process_cpu(api.pid), time.time()
                sampler.stop()
                rows.append(summarize(name, c, outs, cpu1 - cpu0, t1 - t0, rss0, sampler,
                                      store, t0))
                print(rows[-1], file=sys.stderr, flush=True)
            finally:
                api.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    api.wait(30)
                if api.poll() is None:
                    api.kill()
    finally:
        for p in (worker, recorder):
            p.terminate()
        for p in (worker, recorder):
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(60)
            if p.poll() is None:
                p.kill()
        store.close()
    return rows


def summarize(name: str, c: int, outs: list[dict], cpu: float, wall: float, rss0: int,
              sampler: Sampler, store, since: float) -> dict:
    completed = [o for o in outs if o.get("finished") and o.get("done")]
    refused = [o for o in outs if o.get("status") not in (None, 200)
               or str(o.get("error", "")).startswith("connect")]
    cut = len(outs) - len(completed) - len(refused)
    first = [o["first"] - o["sent"] for o in completed if o.get("first")]
    tokens = sum(o.get("tokens", 0) for o in outs)
    from sqlalchemy import select

    from inflight.store.models import RequestRow

    want = {o["id"] for o in completed if o.get("id")}
    deadline = time.monotonic() + RECORDER_WAIT_S
    while True:   # the recorder writes the last rows a moment after the streams end
        worker_first = []
        stamps: dict[str, dict] = {}
        with store.session() as s:
            for rid, timings in s.execute(select(RequestRow.id, RequestRow.timings).where(
                    RequestRow.status == "completed")).all():
                t = timings or {}
                if t.get("submitted_at") and t.get("first_token_at") and \
                        t["submitted_at"] >= since:
                    worker_first.append(t["first_token_at"] - t["submitted_at"])
                    stamps[rid] = t
        if want <= stamps.keys() or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    # a stream's first token, split by the store's stamps (one host, one clock): sent ->
    # filed by the API (HTTP, auth, validation, the claim, the publish) -> first token in
    # the worker -> the client has it (the results reader, the SSE write, this process)
    api_in, out_path = [], []
    for o in completed:
        t = stamps.get(o.get("id", ""))
        if t is not None and o.get("first"):
            api_in.append(t["submitted_at"] - o["sent"])
            out_path.append(o["first"] - t["first_token_at"])
    peak_streams = max(sampler.client_open_peak, 1)
    return {"version": name, "streams": c, "completed": len(completed), "refused": len(refused),
            "cut": cut, "first_p50_s": pct(first, 50), "first_p99_s": pct(first, 99),
            "worker_first_p50_s": pct(worker_first, 50),
            "worker_first_p99_s": pct(worker_first, 99), "tokens": tokens,
            "api_in_p50_s": pct(api_in, 50), "api_in_p99_s": pct(api_in, 99),
            "out_path_p50_s": pct(out_path, 50), "out_path_p99_s": pct(out_path, 99),
            "api_cpu_s": cpu, "wall_s": wall,
            "api_cpu_us_per_token": cpu / tokens * 1e6 if tokens else float("nan"),
            "rss_before_mb": rss0 / 2**20, "rss_peak_mb": sampler.rss_peak / 2**20,
            "open_streams_peak": sampler.streams_peak,
            "client_open_peak": sampler.client_open_peak,
            "rss_at_client_peak_mb": sampler.rss_at_client_peak / 2**20,
            "kb_per_open_stream": max(sampler.rss_at_client_peak - rss0, 0) / peak_streams / 1024,
            "broker_connections_peak": sampler.conns_peak,
            "errors": sorted({o["error"][:80] for o in outs if o.get("error")})[:5]}


def report(rows: list[dict], args) -> None:
    print(f"\nsynthetic engine (a token per {args.step_ms:g} ms step per request, "
          f"{args.max_tokens} tokens each), one worker, one API process, embedded broker, "
          f"{args.partitions} partitions, SQLite; load average {os.getloadavg()[0]:.1f} at "
          "the end\n")
    print("| version | streams | completed | refused | cut | first token p50 / p99 s | "
          "in the worker p50 / p99 s | into the API p50 / p99 s | out p50 / p99 s | "
          "API CPU µs per token | API RSS before / peak MB | "
          "open streams peak API / client | KB per open stream | broker connections | "
          "wall s |")
    print("| --- " * 15 + "|")
    for r in rows:
        print(f"| {r['version']} | {r['streams']:,} | {r['completed']:,} | {r['refused']:,} | "
              f"{r['cut']:,} | {r['first_p50_s']:.2f} / {r['first_p99_s']:.2f} | "
              f"{r['worker_first_p50_s']:.2f} / {r['worker_first_p99_s']:.2f} | "
              f"{r['api_in_p50_s']:.2f} / {r['api_in_p99_s']:.2f} | "
              f"{r['out_path_p50_s']:.2f} / {r['out_path_p99_s']:.2f} | "
              f"{r['api_cpu_us_per_token']:.0f} | {r['rss_before_mb']:.0f} / "
              f"{r['rss_peak_mb']:.0f} | {r['open_streams_peak']:,} / "
              f"{r['client_open_peak']:,} | {r['kb_per_open_stream']:.1f} | "
              f"{r['broker_connections_peak']} | {r['wall_s']:.1f} |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--streams", default="100,1000,4000",
                   type=lambda v: [int(x) for x in v.split(",")])
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--step-ms", type=float, default=50.0)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--connect-rate", type=float, default=2000.0, help="new streams per second")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--before", metavar="PYTHON")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args()
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))
    from inflight.cli.broker import EmbeddedBroker

    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp, \
            EmbeddedBroker(log_path=pathlib.Path(tmp) / "tansu.log") as broker:
        if args.before:
            rows += run_version("before", args.before, args, broker)
        rows += run_version("after" if args.before else "this", sys.executable, args, broker)
    report(rows, args)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows},
                                                      indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
