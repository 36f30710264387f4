"""Batch ingest and output: how fast a large batch file is validated and enqueued, and how
fast its output file is written, against the real embedded broker and Postgres.

    .venv/bin/python benchmarks/batch_ingest.py [--lines 100000] [--line-bytes 1000]
        [--database-url postgresql+psycopg://postgres@127.0.0.1:5432/postgres] [--json out.json]
        [--plot out.png] [--profile DIR]

Targets: validate + enqueue >= 5,000 lines/s with peak RSS < 300 MB; the
output file of all results written at >= 10,000 lines/s.

Steps (each measured step runs in its own child process, so its peak RSS is its own):
1. a JSONL file of N OpenAI chat lines (~line-bytes each) is generated and uploaded into
   the store (files + file_chunks, streamed);
2. `validate_and_enqueue` (what the Celery task runs): every line checked, then queued
   rows inserted and requests published to the batch topic in chunks;
3. every request is marked completed with a ~200-character answer (one SQL UPDATE; not
   measured), then the sweep finalizes the batch: the output file is written;
4. baselines in the same run: the pre-existing `inflight submit --file` path (parse every
   line, then `Client.submit_many`: no validation pass, no rows, all requests in memory)
   for step 2, and ORM pages + stdlib json to a local file for step 3.
Wall and CPU seconds are both reported: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import subprocess
import sys
import tempfile
import time
import uuid

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PG_DEFAULT = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
ANSWER = ("A paged KV cache stores keys and values in fixed-size blocks so that sequences "
          "of any length share one preallocated pool; a block table maps each sequence's "
          "positions to blocks, and finished requests free theirs at once.")


def _peak_rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def write_input(path: pathlib.Path, n: int, line_bytes: int) -> int:
    import orjson

    words = ("the quick brown fox jumps over the lazy dog while kafka carries prompts to "
             "workers and results back to the store ").split()
    total = 0
    with path.open("wb") as f:
        for i in range(n):
            body = {"model": "smol", "max_tokens": 64, "temperature": 0.7, "seed": i,
                    "messages": [{"role": "system", "content": "Answer briefly."},
                                 {"role": "user", "content": ""}]}
            line = {"custom_id": f"req-{i:07d}", "method": "POST",
                    "url": "/v1/chat/completions", "body": body}
            base = len(orjson.dumps(line))
            text, k = [], 0
            while base + sum(len(w) + 1 for w in text) < line_bytes:
                text.append(words[(i + k) % len(words)])
                k += 1
            body["messages"][1]["content"] = " ".join(text)
            data = orjson.dumps(line) + b"\n"
            f.write(data)
            total += len(data)
    return total


# --- child processes ---------------------------------------------------------------------

def child(kind: str, batch_id: str, extra: str | None) -> dict:
    from inflight.producers import batch_jobs as jobs
    from inflight.producers.client import Client
    from inflight.schemas import Settings
    from inflight.store import Store

    settings = Settings()
    store = Store(settings.database_url)
    t0, c0, epoch0 = time.monotonic(), _cpu_s(), time.time()
    out: dict = {}
    if kind == "enqueue":
        with Client(settings, store=store) as client:
            ctx = jobs.JobContext(store=store, publisher=client, settings=settings,
                                  context_length=8192, model_name="smol")
            out["outcome"] = jobs.validate_and_enqueue(ctx, batch_id)
        b = store.require_batch(batch_id)
        out["validated_s"] = b.in_progress_at.timestamp() - epoch0
    elif kind == "finalize":
        with Client(settings, store=store) as client:
            ctx = jobs.JobContext(store=store, publisher=client, settings=settings,
                                  context_length=8192, model_name="smol")
            out["report"] = jobs.sweep(ctx, batch_ids=[batch_id]).to_json()
    elif kind == "baseline-submit":
        from inflight.schemas import parse_batch_line

        reqs = []
        with open(extra, "rb") as f:  # type: ignore[arg-type]
            for n, line in enumerate(f, 1):
                reqs.append(parse_batch_line(line, batch_id=batch_id, line_no=n))
        with Client(settings, store=store) as client:
            client.submit_many(reqs, progress=False)
    elif kind == "baseline-output":
        with open(extra, "w") as f:  # type: ignore[arg-type]
            after = None
            while True:
                rows = store.list_batch(batch_id, after=after, limit=1000)
                if not rows:
                    break
                for r in rows:
                    f.write(json.dumps({"id": r.id, "custom_id": r.custom_id, "response": {
                        "status_code": 200, "body": {"choices": [{"message": {
                            "role": "assistant", "content": r.output}}], "usage": r.usage}},
                        "error": None}) + "\n")
                after = rows[-1].id
    out.update(wall_s=time.monotonic() - t0, cpu_s=_cpu_s() - c0, peak_rss_mb=_peak_rss_mb())
    store.close()
    return out


def run_child(env: dict, kind: str, batch_id: str, extra: str | None = None) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", kind, "--batch-id", batch_id]
                          + (["--extra", extra] if extra is not None else []),
                          env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"child {kind} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --- the run ------------------------------------------------------------------------------

def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lines", type=int, default=100_000)
    p.add_argument("--line-bytes", type=int, default=1000)
    p.add_argument("--database-url", default=os.environ.get("INFLIGHT_TEST_POSTGRES_URL", PG_DEFAULT))
    p.add_argument("--no-baselines", action="store_true")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--plot", metavar="PATH")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--batch-id", help=argparse.SUPPRESS)
    p.add_argument("--extra", help=argparse.SUPPRESS)
    p.add_argument("--profile", metavar="DIR",
                   help="cProfile each measured child into DIR/<step>.prof (slower; the "
                   "main thread only, not the enqueue's insert and send threads)")
    args = p.parse_args()
    if args.child:
        prof_dir = os.environ.get("INFLIGHT_BENCH_PROFILE")
        if prof_dir:
            import cProfile

            with cProfile.Profile() as prof:
                out = child(args.child, args.batch_id, args.extra)
            prof.dump_stats(os.path.join(prof_dir, f"{args.child}.prof"))
        else:
            out = child(args.child, args.batch_id, args.extra)
        print(json.dumps(out, default=str))
        return 0

    import sqlalchemy as sa

    from inflight.cli.broker import EmbeddedBroker
    from inflight.cli.commands import settings_env
    from inflight.cli.topics import create_topics
    from inflight.producers import batch_jobs as jobs
    from inflight.schemas import Settings
    from inflight.store import RequestRow, Store
    from tests.pgdb import temporary_database

    n = args.lines
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp, temporary_database(
            args.database_url, "inflight_bench_") as url:
        tmp = pathlib.Path(tmp)
        broker = EmbeddedBroker(log_path=tmp / "tansu.log").start()
        try:
            tag = uuid.uuid4().hex[:6]
            settings = Settings(kafka_bootstrap=broker.bootstrap, database_url=url,
                                topic_requests=f"b{tag}.requests",
                                topic_requests_batch=f"b{tag}.requests.batch",
                                topic_results=f"b{tag}.results",
                                topic_results_tokens=f"b{tag}.results.tokens",
                                topic_dlq=f"b{tag}.dlq", topic_cancel=f"b{tag}.cancel",
                                data_dir=tmp / "data", cache_dir=tmp / "cache")
            create_topics(settings, partitions=4)
            env = {**os.environ, **settings_env(settings), "PYTHONPATH": str(ROOT)}
            if args.profile:
                pathlib.Path(args.profile).mkdir(parents=True, exist_ok=True)
                env["INFLIGHT_BENCH_PROFILE"] = str(pathlib.Path(args.profile).resolve())
            store = Store(url, create=True)

            path = tmp / "input.jsonl"
            size = write_input(path, n, args.line_bytes)
            print(f"input: {n:,} lines, {size / 1e6:.1f} MB", file=sys.stderr)
            t0 = time.monotonic()
            with path.open("rb") as fh:
                f = store.create_file(iter(lambda: fh.read(1 << 20), b""), purpose="batch",
                                      filename=path.name)
            upload_s = time.monotonic() - t0
            b = jobs.create_batch(store, input_file_id=f.id, endpoint="/v1/chat/completions")
            print(f"uploaded in {upload_s:.1f}s; validating + enqueueing ...", file=sys.stderr)

            ingest = run_child(env, "enqueue", b.id)
            b = store.require_batch(b.id)
            assert b.lines_enqueued == n, (ingest, b)

            with store.session() as s:  # every request answered (not measured)
                s.execute(sa.update(RequestRow).where(RequestRow.batch_id == b.id).values(
                    status="completed", output=ANSWER, finish_reason="stop",
                    usage={"prompt_tokens": 230, "completion_tokens": 40},
                    finished_at=sa.func.now()))
            print("writing the output file ...", file=sys.stderr)
            fin = run_child(env, "finalize", b.id)
            b = store.require_batch(b.id)
            assert b.status == "completed" and store.get_file(b.output_file_id).line_count == n
            out_bytes = store.get_file(b.output_file_id).bytes

            base_in = base_out = None
            if not args.no_baselines:
                print("baselines ...", file=sys.stderr)
                base_in = run_child(env, "baseline-submit", f"base{tag}", str(path))
                base_out = run_child(env, "baseline-output", b.id, str(tmp / "base-out.jsonl"))
            store.close()
        finally:
            broker.stop()

    rows = [("validate + enqueue (batch job)", ingest, ">= 5,000 lines/s, RSS < 300 MB"),
            ("  of which: validate (parse + check every line)",
             {"wall_s": ingest["validated_s"]}, ""),
            ("  of which: enqueue (rows + Kafka, acked)",
             {"wall_s": ingest["wall_s"] - ingest["validated_s"]}, "")]
    if base_in:
        rows.append(("baseline: `submit --file` path (parse all, submit_many)", base_in, ""))
    rows.append(("write output file (sweep: finalize)", fin, ">= 10,000 lines/s"))
    if base_out:
        rows.append(("baseline: ORM pages + json to a local file", base_out, ""))
    print(f"\nbatch of {n:,} lines, {size / 1e6:.1f} MB in, {out_bytes / 1e6:.1f} MB out; "
          f"upload {size / 1e6 / upload_s:.0f} MB/s ({upload_s:.1f} s); Postgres + embedded Tansu; "
          f"{os.cpu_count()} CPUs, load average (1/5/15 min) "
          f"{'/'.join(f'{x:.2f}' for x in load_before)} before, "
          f"{'/'.join(f'{x:.2f}' for x in os.getloadavg())} after\n")
    print("| step | wall s | lines/s | CPU s | peak RSS MB | target |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, r, target in rows:
        cpu = f"{r['cpu_s']:.1f}" if "cpu_s" in r else ""
        rss = f"{r['peak_rss_mb']:.0f}" if "peak_rss_mb" in r else ""
        print(f"| {name} | {r['wall_s']:.1f} | {n / r['wall_s']:,.0f} | {cpu} | {rss} | {target} |")
    figures = {"lines": n, "input_mb": size / 1e6, "output_mb": out_bytes / 1e6,
               "upload_s": upload_s, "ingest": ingest, "finalize": fin,
               "baseline_submit": base_in, "baseline_output": base_out,
               "loadavg_before": load_before, "loadavg_after": os.getloadavg()}
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(figures, indent=2, default=str))
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        names = [r[0].strip() for r in rows if "cpu_s" in r[1]]
        rates = [n / r[1]["wall_s"] for r in rows if "cpu_s" in r[1]]
        fig, ax = plt.subplots(figsize=(9, 4))
        ax.barh(names, rates)
        ax.set_xlabel("lines/s")
        ax.axvline(5000, ls="--", c="grey")
        ax.axvline(10000, ls=":", c="grey")
        fig.tight_layout()
        fig.savefig(args.plot)
    ok = (n / ingest["wall_s"] >= 5000 and ingest["peak_rss_mb"] < 300
          and n / fin["wall_s"] >= 10000)
    print(f"\ntargets {'met' if ok else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
