"""Cancelling a large batch: how many of its requests still complete more than 10 s after
the cancel, with one cancel per request (the old `cancel_batch`: a worker remembers the
last 10,000 cancelled ids, so the first ones are forgotten and run) against one batch-wide
cancel (`{"batch_id": ...}`, kept by every worker for the lookback window). Both in one run,
each on its own topics, against the real embedded broker, a worker and a recorder (threads,
tiny random model by default), SQLite.

    OMP_NUM_THREADS=1 nice python benchmarks/batch_cancel.py [--lines 15000]
        [--cancel-after 1150] [--max-tokens 64] [--model PATH] [--json out.json]

Each run: the batch file is uploaded and `validate_and_enqueue` publishes every line (what
the Celery task does); then the worker starts; once `--cancel-after` requests completed,
the batch is cancelled; the run ends when every request of the batch has a final row.
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

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

LATE_S = 10.0


def batch_file(n: int, max_tokens: int) -> bytes:
    import orjson

    words = "one two three four five six seven eight nine ten".split()
    return b"".join(orjson.dumps({
        "custom_id": f"r{i:06d}", "method": "POST", "url": "/v1/completions",
        "body": {"prompt": " ".join(words[(i + k) % 10] for k in range(4)),
                 "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}}) + b"\n"
        for i in range(n))


def per_request_cancel(store, client, batch_id: str) -> int:
    """The old cancel_batch: `cancelling`, then a cancel for every open request."""
    from inflight.producers.batch_context import open_request_ids
    from inflight.store import CANCELLING

    store.transition_batch(batch_id, CANCELLING)
    return sum(client.cancel_many(ids) for ids in open_request_ids(store, batch_id))


def _watch_cancel(svc, batch_id: str, learned: list[float], timeout: float = 120.0) -> None:
    """Note when the worker's intake first holds the batch as cancelled (polled every ms)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if batch_id in svc.worker.intake.cancelled_batches:
            learned.append(time.time())
            return
        time.sleep(0.001)


def run(mode: str, broker, model: pathlib.Path, work: pathlib.Path, args) -> dict:
    from inflight.engine import Engine, EngineConfig
    from inflight.producers import batch_jobs as jobs
    from inflight.producers.client import Client
    from inflight.store import Store
    from tests.consumers.conftest import Service, make_settings

    work.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{work / 'store.db'}"
    store = Store(url, create=True)
    settings = make_settings(broker, url, partitions=4, worker_max_inflight=args.max_inflight)
    client = Client(settings, store=store)
    f = store.create_file(iter([batch_file(args.lines, args.max_tokens)]), purpose="batch",
                          filename="cancel.jsonl")
    b = jobs.create_batch(store, input_file_id=f.id, endpoint="/v1/completions")
    ctx = jobs.JobContext(store=store, publisher=client, settings=settings,
                          context_length=512, model_name="tiny")
    assert jobs.validate_and_enqueue(ctx, b.id) == "enqueued"
    engine = Engine(EngineConfig(model=str(model), max_num_seqs=args.max_inflight,
                                 num_kv_blocks=2048))
    svc = Service(settings, engine, store)
    out: dict = {"mode": mode}
    try:
        deadline = time.monotonic() + args.timeout
        while store.refresh_batch_counts(b.id).request_completed < args.cancel_after:
            assert time.monotonic() < deadline, "the batch did not start"
            time.sleep(0.2)
        learned: list[float] = []
        watcher = threading.Thread(target=_watch_cancel, args=(svc, b.id, learned), daemon=True)
        if mode == "batch":
            watcher.start()
        t_cancel = time.time()
        if mode == "per-request":
            out["cancel_messages"] = per_request_cancel(store, client, b.id)
        else:
            jobs.cancel_batch(store, client, b.id)
            out["cancel_messages"] = 1
        t_returned = time.time()
        out["cancel_send_s"] = t_returned - t_cancel
        if mode == "batch":
            watcher.join(timeout=args.timeout)
        out["worker_learned_s"] = (learned[0] - t_cancel) if learned else None
        while True:
            if not store.list_batch(b.id, status=["queued", "running"], limit=1):
                break
            assert time.monotonic() < deadline + args.timeout, "requests still open"
            time.sleep(0.5)
        out["all_ended_s"] = time.time() - t_cancel
        completed_after = late = late1 = 0
        after = None
        while True:
            page = store.list_batch(b.id, status=["completed"], after=after, limit=1000)
            if not page:
                break
            for r in page:
                if r.finished_at is not None and r.finished_at.timestamp() > t_cancel:
                    completed_after += 1
                    late += r.finished_at.timestamp() > t_cancel + LATE_S
                    late1 += r.finished_at.timestamp() > t_returned + 1.0
            after = page[-1].id
        b = store.refresh_batch_counts(b.id)
        out.update(completed_before=b.request_completed - completed_after,
                   completed_after=completed_after, completed_late=late,
                   completed_late_1s=late1,
                   cancelled=b.request_cancelled, total=b.request_total)
        return out
    finally:
        svc.stop()
        client.close()
        store.close()


def main() -> int:
    from inflight.cli.broker import EmbeddedBroker
    from tests.tiny_llama import write_tiny_llama

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lines", type=int, default=15_000)
    p.add_argument("--cancel-after", type=int, default=1_150)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--max-inflight", type=int, default=64)
    p.add_argument("--model", help="a model folder (default: a tiny random Llama)")
    p.add_argument("--mode", action="append", choices=("per-request", "batch"))
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    work = pathlib.Path(tempfile.mkdtemp(prefix="batch-cancel-"))
    model = pathlib.Path(args.model) if args.model else write_tiny_llama(work / "tiny")
    load = os.getloadavg()
    results = []
    with EmbeddedBroker(log_path=work / "tansu.log") as broker:
        for mode in args.mode or ("per-request", "batch"):
            print(f"{mode} ...", file=sys.stderr, flush=True)
            results.append(run(mode, broker, model, work / mode, args))
            print(results[-1], file=sys.stderr, flush=True)
    print(f"\nbatch of {args.lines:,} lines ({args.max_tokens} tokens each, tiny model, "
          f"{args.max_inflight} in flight), cancelled once {args.cancel_after:,} had completed; "
          f"load average {load[0]:.1f} before, {os.getloadavg()[0]:.1f} after\n")
    print("| cancel | messages | completed after the cancel | of which > 10 s after | "
          "ended cancelled | all ended after |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in results:
        name = ("one per request (before)" if r["mode"] == "per-request"
                else "one for the batch (after)")
        print(f"| {name} | {r['cancel_messages']:,} | {r['completed_after']:,} | "
              f"{r['completed_late']:,} | {r['cancelled']:,} | {r['all_ended_s']:.1f} s |")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
