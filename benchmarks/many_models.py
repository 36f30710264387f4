"""Two models behind one queue against each model served alone, in the same run.

    .venv/bin/python benchmarks/many_models.py [--num-requests 16] [--batch-lines 8]
        [--tiny] [--json out.json] [--plot out.png]

Models: SmolLM2-135M-Instruct (model A, the default: today's topics) and Gemma 3 270M
(model B, `inflight model fetch --name gemma3-270m`: its own topics and group), fp32 on CPU,
one torch thread per worker; `--tiny`: two tiny random models (tests/tiny_llama.py,
tests/tiny_families.py) instead, for a quick run. The whole path, as deployed: one embedded
broker, each worker its own `inflight worker --model ... --served-model-name ...` process,
the recorder and `inflight jobs` processes, SQLite; requests through `Client.submit`.

Phases, each on the same broker and store, with the same workload per model:
1. A alone: A's worker only; A's requests (no `model`: the default).
2. B alone: B's worker only; B's requests (`model="gemma-3-270m"`).
3. together: both workers; A's and B's requests interleaved in one stream, then one OpenAI
   batch file that mixes both models line by line (`Client.create_batch`, `inflight jobs`).
Per model: output tok/s (its output tokens / its first submit -> last finish), TTFT p50 /
p90 (submitted -> first token, the stored timings), worker CPU seconds per 1,000 output
tokens (psutil), and whether the tokens equal the alone run's. The box's cores are shared
by both workers in phase 3 (and by other work: the load average is printed).

Routing cost per request, in this process, with both models live in the registry (process
CPU time per call): the Client's (`routed`: route, wire model, topic) and the API's
(`ApiModels.resolve` + `routed` + the route's topic), for the default and a named model, beside
the topic choice before models (priority -> one of two fixed topics) and `encode(request)`.
"""

from __future__ import annotations

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

from common import (base_parser, lognormal_lengths, machine_note, percentile, print_table,  # noqa: E402
                    process_cpu, random_tokens, write_json)

A_NAME, B_NAME = "SmolLM2-135M-Instruct", "gemma-3-270m"


def models(args, tmp: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path, str, str]:
    if args.tiny:
        from tests.tiny_families import write_tiny_family
        from tests.tiny_llama import write_tiny_llama

        return (write_tiny_llama(tmp / "tiny-llama", hidden_size=256, num_layers=4),
                write_tiny_family(tmp / "tiny-gemma3", "gemma3", hidden_size=256,
                                  intermediate_size=512, num_hidden_layers=4,
                                  layer_types=["sliding_attention", "full_attention"] * 2),
                "tiny-llama", "tiny-gemma3")
    from inflight.cli.model import ensure_bundled_model
    from inflight.schemas import Settings

    s = Settings()
    return (ensure_bundled_model("smollm2-135m", s), ensure_bundled_model("gemma3-270m", s),
            A_NAME, B_NAME)


def workload(n: int, seed: int, vocab: int, low: int) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    prompts = lognormal_lengths(rng, n, 48, 0.5, 16, 128)
    outputs = lognormal_lengths(rng, n, 24, 0.4, 8, 48)
    return [(random_tokens(rng, p, vocab, low), o) for p, o in zip(prompts, outputs)]


class Procs:
    """The service's processes of one phase, stopped (SIGTERM, then kill) at the end."""

    def __init__(self, settings, log: pathlib.Path):
        from inflight.cli.commands import settings_env

        self.env = {**os.environ, **settings_env(settings), "OMP_NUM_THREADS": "1",
                    "PYTHONPATH": str(ROOT)}
        self.log = log
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, *argv: str) -> subprocess.Popen:
        self.procs[name] = subprocess.Popen([sys.executable, "-m", "inflight", *argv], cwd=ROOT,
                                            env=self.env, stdout=subprocess.DEVNULL,
                                            stderr=open(self.log / f"{name}.log", "ab"))
        return self.procs[name]

    def worker(self, name: str, folder: pathlib.Path, served: str) -> subprocess.Popen:
        return self.start(name, "worker", "--model", str(folder), "--served-model-name", served)

    def stop(self, *names: str) -> None:
        for n in names or list(self.procs):
            p = self.procs.pop(n, None)
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(60)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def wait_models(client, want: set[str], timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while {m.id for m in client.models()} != want:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the registry lists {[m.id for m in client.models()]}, not {want}")
        time.sleep(0.2)


def run_stream(client, store, work: dict[str, list], names: dict[str, str]) -> dict:
    """Submit every model's requests, interleaved; per model: tokens, tok/s, TTFT."""
    from inflight.schemas import SamplingParams

    order = []
    for i in range(max(len(w) for w in work.values())):
        order += [(m, work[m][i]) for m in work if i < len(work[m])]
    ids: dict[str, list[str]] = {m: [] for m in work}
    for m, (prompt, out) in order:
        rid = client.submit({"prompt_token_ids": prompt},
                            SamplingParams(max_tokens=out, temperature=0.0, ignore_eos=True),
                            model=names[m], flush=False)
        ids[m].append(rid)
    client.flush()
    rows = client.wait_many([i for v in ids.values() for i in v], timeout=1800)
    result = {}
    for m, rids in ids.items():
        got = [client.result(r) for r in rids]
        if any(not r.done or r.status != "completed" for r in got):
            raise RuntimeError(f"{m}: not every request completed: {[r.status for r in got]}")
        t = [r.timings for r in got]
        tokens = sum(len(r.token_ids) for r in got)
        wall = max(x["finished_at"] for x in t) - min(x["submitted_at"] for x in t)
        ttft = [x["first_token_at"] - x["submitted_at"] for x in t]
        result[m] = {"requests": len(got), "output_tokens": tokens, "wall_s": wall,
                     "tok_s": tokens / wall, "ttft_p50_s": percentile(ttft, 50),
                     "ttft_p90_s": percentile(ttft, 90), "token_ids": [r.token_ids for r in got],
                     "models": sorted({r.model for r in got})}
    assert len(rows) == sum(len(v) for v in ids.values())
    return result


def warm(client, names: list[str]) -> None:
    from inflight.schemas import SamplingParams

    rids = [client.submit({"prompt_token_ids": [200, 201, 202]},
                          SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True), model=n)
            for n in names]
    if len(client.wait_many(rids, timeout=300)) != len(rids):
        raise RuntimeError("the warm-up requests did not finish")


def run_batch(client, work: dict[str, list], names: dict[str, str], lines: int) -> dict:
    """One OpenAI batch file mixing the models line by line; per model: tokens, tok/s."""
    import orjson

    rows, model_of = [], {}
    for i in range(lines):
        for m in work:
            prompt, out = work[m][i % len(work[m])]
            cid = f"{m}-{i}"
            model_of[cid] = m
            rows.append({"custom_id": cid, "method": "POST", "url": "/v1/completions",
                         "body": {"model": names[m], "prompt": prompt, "max_tokens": out,
                                  "temperature": 0, "ignore_eos": True}})
    path = pathlib.Path(tempfile.mkdtemp()) / "mixed.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    t0 = time.time()
    b = client.create_batch(path, endpoint="/v1/completions", completion_window="24h")
    b = client.wait_batch(b.id, timeout=3600)
    wall = time.time() - t0
    if b.status != "completed":
        raise RuntimeError(f"the mixed batch ended {b.status}: {b.errors}")
    out = {m: {"lines": 0, "output_tokens": 0, "model_ok": True} for m in work}
    for line in client.batch_results(b.id):
        m = model_of[line["custom_id"]]
        body = line["response"]["body"]
        out[m]["lines"] += 1
        out[m]["output_tokens"] += body["usage"]["completion_tokens"]
        out[m]["model_ok"] &= body["model"] == names[m]
    for m in out:
        out[m]["tok_s"] = out[m]["output_tokens"] / wall
    return {"wall_s": wall, "per_model": out}


def routing_cost(settings, names: dict[str, str], n: int) -> list[tuple]:
    """µs of process CPU per call, with both models live in the registry."""
    from inflight.api.follow import routed
    from inflight.api.served_models import ApiModels
    from inflight.producers.client import Client
    from inflight.schemas import InferenceRequest, encode

    client = Client(settings)
    try:
        wait_models(client, set(names.values()))
        api = ApiModels(client.models_client)
        base = InferenceRequest(request_id="r" * 32, prompt_token_ids=list(range(100, 164)))
        named = base.model_copy(update={"model": names["B"]})
        s = settings

        def before(req=base):  # the topic choice before models (requests_client, issue 29)
            return s.topic_requests_batch if req.priority >= 10 else s.topic_requests

        def client_route(req):  # what Client.submit adds: the route, the wire model, the topic
            return client.routed(req)

        def api_route(req):  # what a route handler adds: resolve (404s), the wire model, the topic
            route = api.resolve(req.model)
            return routed(req, route), route.topic(req.priority >= 10)

        cases = [("topic choice before models (baseline)", before, base),
                 ("Client: default model", client_route, base),
                 ("Client: named model", client_route, named),
                 ("API: default model", api_route, base),
                 ("API: named model", api_route, named),
                 ("encode(request), for scale", encode, base)]
        rows = []
        for label, fn, req in cases:
            for _ in range(200):
                fn(req)
            c0 = time.process_time()
            for _ in range(n):
                fn(req)
            rows.append((label, (time.process_time() - c0) / n * 1e6))
        return rows
    finally:
        client.close()


def plot(path: str, results: dict, names: dict[str, str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    labels = [names[m] for m in ("A", "B")]
    x = range(len(labels))
    for ax, key, title in ((axes[0], "tok_s", "output tok/s"), (axes[1], "ttft_p50_s",
                                                                "TTFT p50 (s)")):
        alone = [results["alone"][m][key] for m in ("A", "B")]
        together = [results["together"][m][key] for m in ("A", "B")]
        ax.bar([i - 0.2 for i in x], alone, 0.4, label="served alone")
        ax.bar([i + 0.2 for i in x], together, 0.4, label="both at once")
        ax.set_xticks(list(x), labels)
        ax.set_title(title)
        ax.legend()
    fig.suptitle("Two models behind one queue vs each alone (CPU, whole path)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="two tiny random models instead")
    p.add_argument("--batch-lines", type=int, default=8, help="batch lines per model")
    p.add_argument("--route-calls", type=int, default=20_000)
    p.set_defaults(num_requests=16)
    args = p.parse_args()
    import logging

    logging.basicConfig(level=logging.WARNING)
    from inflight.cli.broker import EmbeddedBroker
    from inflight.producers.client import Client
    from inflight.schemas import Settings
    from inflight.store import Store
    from inflight.transport.topics_admin import create_topics

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="inflight-many-"))
    path_a, path_b, name_a, name_b = models(args, tmp)
    names = {"A": name_a, "B": name_b}
    folders = {"A": path_a, "B": path_b}
    import json

    vocab = {m: json.loads((f / "config.json").read_text())["vocab_size"] for m, f in folders.items()}
    low = 3 if args.tiny else 100
    work = {m: workload(args.num_requests, args.seed + i, vocab[m], low)
            for i, m in enumerate(("A", "B"))}
    print(f"models A={name_a} ({path_a.name}), B={name_b} ({path_b.name}); {args.num_requests} "
          f"requests per model, prompt tokens {[sum(len(x) for x, _ in work[m]) for m in work]}, "
          f"output tokens {[sum(o for _, o in work[m]) for m in work]}; {machine_note()}",
          flush=True)
    results: dict = {"alone": {}}
    with EmbeddedBroker(log_path=tmp / "tansu.log") as broker:
        tag = uuid.uuid4().hex[:8]
        s = Settings(kafka_bootstrap=broker.bootstrap, kafka_session_timeout_ms=4000,
                     kafka_heartbeat_interval_ms=1000, topic_requests=f"m{tag}.requests",
                     topic_requests_batch=f"m{tag}.requests.batch",
                     topic_results=f"m{tag}.results", topic_results_tokens=f"m{tag}.results.tokens",
                     topic_dlq=f"m{tag}.dlq", topic_cancel=f"m{tag}.cancel",
                     topic_models=f"m{tag}.models", worker_group=f"m{tag}-workers",
                     recorder_group=f"m{tag}-recorder", default_model=name_a,
                     database_url=f"sqlite:///{tmp / 'bench.db'}", data_dir=tmp / "data",
                     worker_max_inflight=32, registry_heartbeat_s=1.0, registry_ttl_s=5.0,
                     metrics_interval_s=0.0, batch_sweep_interval_s=1.0, dtype=args.dtype)
        create_topics(s, partitions=2)
        store = Store(s.database_url, create=True)
        procs = Procs(s, tmp)
        procs.start("recorder", "recorder")
        client = Client(s, store=store)
        try:
            for m in ("A", "B"):  # each model alone
                worker = procs.worker(m, folders[m], names[m])
                wait_models(client, {names[m]})
                warm(client, [names[m]])
                cpu0 = process_cpu(worker.pid)
                got = run_stream(client, store, {m: work[m]}, names)[m]
                got["worker_cpu_s"] = process_cpu(worker.pid) - cpu0
                results["alone"][m] = got
                print(f"{names[m]} alone: {got['tok_s']:.1f} tok/s", flush=True)
                procs.stop(m)
            workers = {m: procs.worker(m, folders[m], names[m]) for m in ("A", "B")}
            procs.start("jobs", "jobs", "--concurrency", "1")
            wait_models(client, set(names.values()))
            warm(client, list(names.values()))
            cpu0 = {m: process_cpu(w.pid) for m, w in workers.items()}
            results["together"] = run_stream(client, store, work, names)
            for m, w in workers.items():
                results["together"][m]["worker_cpu_s"] = process_cpu(w.pid) - cpu0[m]
            print("together: " + ", ".join(f"{names[m]} {results['together'][m]['tok_s']:.1f} "
                                          "tok/s" for m in ("A", "B")), flush=True)
            results["batch"] = run_batch(client, work, names, args.batch_lines)
            results["routing_us"] = routing_cost(s, names, args.route_calls)
        finally:
            client.close()
            procs.stop()
            store.close()
    report(args, results, names)


def report(args, results: dict, names: dict[str, str]) -> None:
    rows = []
    for m in ("A", "B"):
        alone, both = results["alone"][m], results["together"][m]
        same = "yes" if alone["token_ids"] == both["token_ids"] else "NO"
        for label, r in (("alone", alone), ("both at once", both)):
            rows.append((names[m], label, r["requests"], r["output_tokens"], r["wall_s"],
                         r["tok_s"], f"{r['tok_s'] / alone['tok_s']:.2f}x", r["ttft_p50_s"],
                         r["ttft_p90_s"], r["worker_cpu_s"] / r["output_tokens"] * 1000,
                         ",".join(r["models"]), same if label != "alone" else "-"))
    print_table("Per model: served alone vs both models at once (whole path, same run)", rows,
                ("model", "served", "requests", "output tokens", "wall s", "output tok/s",
                 "vs alone", "TTFT p50 s", "TTFT p90 s", "worker CPU s / 1k tok",
                 "stored model", "same tokens"))
    b = results["batch"]
    print_table(f"One batch file mixing both models ({b['wall_s']:.1f} s create -> completed)",
                [(names[m], r["lines"], r["output_tokens"], r["tok_s"],
                  "yes" if r["model_ok"] else "NO") for m, r in b["per_model"].items()],
                ("model", "lines", "output tokens", "output tok/s over the batch",
                 "answered by its model"))
    print_table("Routing cost per request (process CPU, both models live)",
                [(label, us) for label, us in results["routing_us"]], ("path", "µs per call"))
    print(f"\n{machine_note()}")
    if args.plot:
        plot(args.plot, results, names)
    if args.json:
        clean = {k: ({m: {kk: vv for kk, vv in r.items() if kk != "token_ids"}
                      for m, r in v.items()} if k in ("alone", "together") else v)
                 for k, v in results.items()}
        write_json(args.json, {"args": vars(args), "models": names, "results": clean})


if __name__ == "__main__":
    main()
