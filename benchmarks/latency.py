"""Interactive latency: one request at a time on an idle worker, the engine alone against
the whole path, side by side in one run.

    OMP_NUM_THREADS=1 python benchmarks/latency.py [--model PATH] [--rounds 20]
        [--max-tokens 32] [--threads 1] [--before PYTHON] [--json out.json]

- engine alone: an `Engine` built as the worker builds it (engine_bridge.build_engine, the
  same settings), stepped in a thread with the worker's torch thread count; time to first
  token = add_request -> the first step output with tokens, final = -> the finished output.
- the path, per version (this checkout; `--before PYTHON`: also the interpreter of another
  checkout, e.g. a worktree of main before a change, with its own editable install): an
  `inflight worker`, `inflight recorder` and `inflight api` of that version as processes,
  on one embedded broker (memory storage) and SQLite, the client in a process of that
  version too (this script, re-run as `--path`):
  * Client: `Client.submit` then `Client.stream`: submit -> first token delta / final event;
  * API: a streamed `POST /v1/chat/completions` over loopback: request sent -> first
    content chunk / the chunk with finish_reason.
  The path's breakdown comes from the final event's timings (same host, same clock):
  submit -> admitted by the intake, admitted -> first token in the worker's engine,
  first token -> the client has it.
- idle CPU: CPU seconds per second of the worker, API and recorder processes over
  `--idle-s` seconds with nothing to do (what short fetch waits cost).

Every request: the same chat message, greedy, `--max-tokens` tokens (ignore_eos).
"""

from __future__ import annotations

import argparse
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
for p in (str(ROOT / "benchmarks"),):
    if p not in sys.path:
        sys.path.insert(0, p)

from common import explicit_env, percentile as pct, process_cpu, wait_api  # noqa: E402

MESSAGES = [{"role": "user", "content": "Name three colours of the rainbow."}]
PAUSE_S = 0.3   # between rounds: the worker is idle when each request arrives


def ms(values: list[float], q: float) -> float:
    return pct(values, q) * 1000.0


# --- the engine alone ------------------------------------------------------------------

def engine_alone(model: str, args) -> dict:
    from inflight.consumers.engine_bridge import build_engine
    from inflight.engine import SamplingParams
    from inflight.schemas import Settings

    box: dict = {}

    def run() -> None:
        import torch

        from inflight.consumers.worker import settle_heap

        torch.set_num_threads(args.threads)
        engine = build_engine(Settings(model_path=model))
        settle_heap()  # as the worker does once it has started
        params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
        ttft, final = [], []
        for i in range(args.rounds + args.warmup):
            t0 = time.time()
            engine.add_request(f"e{i}", messages=MESSAGES, params=params, arrival_time=t0)
            first = None
            while engine.has_unfinished():
                for out in engine.step():
                    now = time.time()
                    if first is None and out.new_token_ids:
                        first = now - t0
                    if out.finished:
                        if i >= args.warmup:
                            ttft.append(first)
                            final.append(now - t0)
            time.sleep(PAUSE_S)
        box["value"] = {"ttft": ttft, "final": final}

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return box["value"]


# --- the path (run as `--path`, by the interpreter of the version measured) ---------------

def _client_round(client, args) -> dict:
    from inflight.schemas import FinalEvent, SamplingParams, TokenEvent

    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    t0 = time.time()
    rid = client.submit(messages=MESSAGES, params=params)
    first = None
    for ev in client.stream(rid, timeout=120):
        now = time.time()
        if isinstance(ev, TokenEvent) and first is None and ev.token_ids:
            first = now
        if isinstance(ev, FinalEvent):
            t = ev.timings
            return {"ttft": first - t0, "final": now - t0,
                    "in": t.queued_at - t0, "engine_ttft": t.first_token_at - t.queued_at,
                    "out_first": first - t.first_token_at, "out_final": now - t.finished_at}
    raise RuntimeError(f"{rid} ended without a final event")


def _api_round(http, args) -> dict:
    import orjson

    body = {"model": "default", "messages": MESSAGES, "max_tokens": args.max_tokens,
            "temperature": 0.0, "ignore_eos": True, "stream": True}
    t0 = time.time()
    first = None
    with http.stream("POST", "/v1/chat/completions", json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"chat completion: {resp.status_code} {resp.read()[:300]!r}")
        for line in resp.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = orjson.loads(line[6:])
            choice = (chunk.get("choices") or [{}])[0]
            now = time.time()
            if first is None and choice.get("delta", {}).get("content"):
                first = now
            if choice.get("finish_reason"):
                return {"ttft": first - t0, "final": now - t0}
    raise RuntimeError("the chat stream ended without a finish_reason")


def path(args) -> dict:
    import httpx

    from inflight.api.keys import create_key
    from inflight.cli.topics import create_topics
    from inflight.producers.client import Client
    from inflight.schemas import Settings
    from inflight.store import Store, upgrade

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="inflight-latency-"))
    tag = uuid.uuid4().hex[:8]
    db = f"sqlite:///{tmp / 'store.db'}"
    upgrade(db)
    s = Settings(kafka_bootstrap=args.bootstrap, database_url=db, model_path=args.model,
                 served_model_name="default", metrics_interval_s=0.0,
                 topic_requests=f"l{tag}.requests", topic_requests_batch=f"l{tag}.requests.batch",
                 topic_results=f"l{tag}.results", topic_results_tokens=f"l{tag}.results.tokens",
                 topic_dlq=f"l{tag}.dlq", topic_cancel=f"l{tag}.cancel",
                 worker_group=f"l{tag}-workers", recorder_group=f"l{tag}-recorder",
                 kafka_session_timeout_ms=6000, kafka_heartbeat_interval_ms=1000,
                 cache_dir=pathlib.Path(args.cache_dir), data_dir=tmp / "data")
    create_topics(s, partitions=4)
    env = {**os.environ, **explicit_env(s), "OMP_NUM_THREADS": str(args.threads)}
    port = args.port
    log = open(tmp / "procs.log", "wb")
    cmd = [sys.executable, "-m", "inflight"]
    # NOTE: cwd outside any checkout: `python -m inflight` would import ./inflight first
    run = {"env": env, "stdout": log, "stderr": subprocess.STDOUT, "cwd": tmp}
    procs = {"worker": subprocess.Popen(cmd + ["worker"], **run),
             "recorder": subprocess.Popen(cmd + ["recorder"], **run),
             "api": subprocess.Popen(cmd + ["api", "--port", str(port)], **run)}
    store = Store(db)
    key = create_key(store, "latency")
    client = Client(s, store=store)
    out: dict = {"python": sys.executable, "log": str(tmp / "procs.log")}
    try:
        url = f"http://127.0.0.1:{port}"
        wait_api(url, procs["api"], 120.0)
        http = httpx.Client(base_url=url, timeout=120,
                            headers={"Authorization": f"Bearer {key.token}"})
        for _ in range(args.warmup):  # the group joined, every connection and reader open
            _client_round(client, args)
            _api_round(http, args)
        time.sleep(2.0)
        cpu0 = {name: process_cpu(p.pid) for name, p in procs.items()}
        time.sleep(args.idle_s)
        out["idle_cpu"] = {name: (process_cpu(p.pid) - cpu0[name]) / args.idle_s
                           for name, p in procs.items()}
        rounds: dict[str, list[dict]] = {"client": [], "api": []}
        for _ in range(args.rounds):
            rounds["client"].append(_client_round(client, args))
            time.sleep(PAUSE_S)
            rounds["api"].append(_api_round(http, args))
            time.sleep(PAUSE_S)
        out["rounds"] = rounds
        http.close()
        return out
    finally:
        client.close()
        store.close()
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


def run_path(python: str, args, bootstrap: str) -> dict:
    """This script as `--path` under `python` (a version's interpreter); its JSON result."""
    from inflight.cli.broker import free_port

    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    cmd = [python, __file__, "--path", "--bootstrap", bootstrap, "--model", args.model,
           "--rounds", str(args.rounds), "--warmup", str(args.warmup),
           "--max-tokens", str(args.max_tokens), "--threads", str(args.threads),
           "--idle-s", str(args.idle_s), "--port", str(free_port()),
           "--cache-dir", args.cache_dir, "--json", out]
    subprocess.run(cmd, check=True, cwd=tempfile.gettempdir())
    return json.loads(pathlib.Path(out).read_text())


# --- report --------------------------------------------------------------------------

def report(engine: dict, engine_again: dict, versions: dict[str, dict], args) -> None:
    base_ttft = ms(engine["ttft"] + engine_again["ttft"], 50)
    base_final = ms(engine["final"] + engine_again["final"], 50)
    print(f"\n{args.rounds} rounds, one request at a time ({args.max_tokens} tokens, greedy), "
          f"idle worker, {args.threads} torch thread(s), embedded broker, SQLite; load average "
          f"{os.getloadavg()[0]:.1f} at the end")
    print("\n| system | TTFT p50 ms | TTFT p99 ms | final p50 ms | final p99 ms | "
          "added to TTFT p50 ms | added to final p50 ms |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, r in (("engine alone", engine), ("engine alone (again)", engine_again)):
        print(f"| {name} | {ms(r['ttft'], 50):.1f} | {ms(r['ttft'], 99):.1f} | "
              f"{ms(r['final'], 50):.1f} | {ms(r['final'], 99):.1f} | | |")
    for version, res in versions.items():
        for via in ("client", "api"):
            rs = res["rounds"][via]
            ttft, final = [r["ttft"] for r in rs], [r["final"] for r in rs]
            print(f"| {version}: {'Client.stream' if via == 'client' else 'API chat stream'} | "
                  f"{ms(ttft, 50):.1f} | {ms(ttft, 99):.1f} | {ms(final, 50):.1f} | "
                  f"{ms(final, 99):.1f} | {ms(ttft, 50) - base_ttft:+.1f} | "
                  f"{ms(final, 50) - base_final:+.1f} |")
    print("\n(added = path p50 - engine-alone p50, both engine-alone runs pooled)")
    print("\nWhere the time goes (Client path, p50 ms, from the final event's timings):\n")
    print("| version | submit -> admitted | engine: admitted -> first token | first token -> "
          "client | finished -> client |")
    print("| --- | --- | --- | --- | --- |")
    for version, res in versions.items():
        rs = res["rounds"]["client"]
        print(f"| {version} | " + " | ".join(f"{ms([r[k] for r in rs], 50):.1f}" for k in (
            "in", "engine_ttft", "out_first", "out_final")) + " |")
    print("\nIdle CPU (CPU seconds per second, nothing to do):\n")
    print("| version | worker | API | recorder |")
    print("| --- | --- | --- | --- |")
    for version, res in versions.items():
        c = res["idle_cpu"]
        print(f"| {version} | {c['worker']:.3f} | {c['api']:.3f} | {c['recorder']:.3f} |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="model folder (default: the bundled "
                   "SmolLM2-135M; `tiny`: a tiny random Llama, the path's own cost alone)")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    p.add_argument("--idle-s", type=float, default=10.0)
    p.add_argument("--before", metavar="PYTHON", help="also measure the path of this interpreter's "
                   "checkout (listed first, as 'before')")
    p.add_argument("--json", metavar="PATH")
    # internal: one version's path, run by that version's interpreter
    p.add_argument("--path", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--bootstrap", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--cache-dir", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.path:
        result = path(args)
        pathlib.Path(args.json).write_text(json.dumps(result))
        return 0

    from inflight.cli.broker import EmbeddedBroker
    from inflight.engine.model_folder import resolve_model
    from inflight.schemas import Settings

    settings = Settings()
    args.cache_dir = str(settings.cache_dir)
    if args.model == "tiny":
        sys.path.insert(0, str(ROOT))
        from tests.tiny_llama import write_tiny_llama

        args.model = str(write_tiny_llama(pathlib.Path(tempfile.mkdtemp()) / "tiny"))
    args.model = str(resolve_model(args.model, settings.cache_dir))
    print(f"model {pathlib.Path(args.model).name}; engine alone ...", file=sys.stderr, flush=True)
    engine = engine_alone(args.model, args)
    versions: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp, \
            EmbeddedBroker(log_path=pathlib.Path(tmp) / "tansu.log") as broker:
        if args.before:
            print("path, before ...", file=sys.stderr, flush=True)
            versions["before"] = run_path(args.before, args, broker.bootstrap)
        print("path ...", file=sys.stderr, flush=True)
        versions["after" if args.before else "path"] = run_path(sys.executable, args,
                                                                broker.bootstrap)
    print("engine alone again ...", file=sys.stderr, flush=True)
    engine_again = engine_alone(args.model, args)
    report(engine, engine_again, versions, args)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(
            {"engine": engine, "engine_again": engine_again, "versions": versions}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
