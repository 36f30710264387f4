"""Cancelling a large batch: how many of its requests still complete after the cancel
(and more than 1 s / 10 s after it returned), and how long the worker took to learn of it.
Modes, each on its own topics, against the real embedded broker, a worker and a recorder
(threads, tiny random model by default), SQLite:

- `per-request`: one cancel per request (the old `cancel_batch`: a worker remembers the
  last 10,000 cancelled ids, so the first ones are forgotten and run);
- `batch-inline`: one batch-wide cancel read the old way, by the intake thread itself
  every 0.1 s (start-offset lookups of up to 200 ms on that thread, every 0.5 s);
- `batch`: one batch-wide cancel read by the cancel reader's own thread (today's).

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


class InlineCancelListener:
    """The cancel reader before it had a thread: lookups and fetches on the intake's thread
    (0.5 s between lookups of at most 200 ms, a non-blocking read every 0.1 s)."""

    def __init__(self, settings, since=None):
        from inflight.consumers.cancel import CancelListener

        base = CancelListener
        listener = object.__new__(base)
        listener.RESOLVE_EVERY_S, listener.LOOKUP_TIMEOUT_MS = 0.5, 200
        # the constructor's catch-up, without the reader thread
        if since is None:
            since = time.time() - settings.cancel_lookback_s
        from kafka import TopicPartition

        from inflight.transport.kafka_clients import partitions_of, plain_consumer

        listener.since_ms = int(since * 1000)
        listener.consumer = plain_consumer(settings, fetch_max_wait_ms=50)
        parts = partitions_of(listener.consumer, settings.topic_cancel)
        listener.tps = [TopicPartition(settings.topic_cancel, p) for p in parts]
        listener.consumer.assign(listener.tps)
        listener.consumer.pause(*listener.tps)
        listener._unresolved = set(listener.tps)
        listener._behind = False
        listener._next_resolve = 0.0
        listener._backlog = listener._catch_up()
        self.listener, self.next = listener, 0.0

    def poll(self):
        ids, self.listener._backlog = self.listener._backlog, []
        if time.monotonic() < self.next:
            return ids
        self.next = time.monotonic() + 0.1
        self.listener._resolve()
        if len(self.listener._unresolved) < len(self.listener.tps):
            self.listener._read(0, ids)
        return ids

    def close(self):
        self.listener.consumer.close()


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
    from inflight.consumers import intake

    threaded = intake.CancelListener
    if mode == "batch-inline":
        intake.CancelListener = InlineCancelListener
    try:
        svc = Service(settings, engine, store)
    finally:
        intake.CancelListener = threaded
    out: dict = {"mode": mode}
    try:
        deadline = time.monotonic() + args.timeout
        while store.refresh_batch_counts(b.id).request_completed < args.cancel_after:
            assert time.monotonic() < deadline, "the batch did not start"
            time.sleep(0.2)
        learned: list[float] = []
        watcher = threading.Thread(target=_watch_cancel, args=(svc, b.id, learned), daemon=True)
        if mode != "per-request":
            watcher.start()
        t_cancel = time.time()
        if mode == "per-request":
            out["cancel_messages"] = per_request_cancel(store, client, b.id)
        else:
            jobs.cancel_batch(store, client, b.id)
            out["cancel_messages"] = 1
        t_returned = time.time()
        out["cancel_send_s"] = t_returned - t_cancel
        if mode != "per-request":
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


def plot(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.2))
    names = [r["mode"] for r in results]
    a.bar(names, [r["completed_after"] for r in results], label="after the cancel")
    a.bar(names, [r["completed_late_1s"] for r in results], label="> 1 s after it returned")
    a.set_ylabel("batch requests completed")
    a.legend(fontsize=8)
    b.bar(names, [r.get("worker_learned_s") or 0 for r in results])
    b.set_ylabel("worker knew of the cancel after (s)")
    for ax in (a, b):
        ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    from inflight.cli.broker import EmbeddedBroker
    from tests.tiny_llama import write_tiny_llama

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lines", type=int, default=15_000)
    p.add_argument("--cancel-after", type=int, default=1_150)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--max-inflight", type=int, default=64)
    p.add_argument("--model", help="a model folder (default: a tiny random Llama)")
    p.add_argument("--mode", action="append", choices=("per-request", "batch-inline", "batch"))
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--plot", metavar="PNG", help="a bar plot of the table")
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    work = pathlib.Path(tempfile.mkdtemp(prefix="batch-cancel-"))
    model = pathlib.Path(args.model) if args.model else write_tiny_llama(work / "tiny")
    load = os.getloadavg()
    results = []
    with EmbeddedBroker(log_path=work / "tansu.log") as broker:
        for mode in args.mode or ("per-request", "batch-inline", "batch"):
            print(f"{mode} ...", file=sys.stderr, flush=True)
            results.append(run(mode, broker, model, work / mode, args))
            print(results[-1], file=sys.stderr, flush=True)
    print(f"\nbatch of {args.lines:,} lines ({args.max_tokens} tokens each, tiny model, "
          f"{args.max_inflight} in flight), cancelled once {args.cancel_after:,} had completed; "
          f"load average {load[0]:.1f} before, {os.getloadavg()[0]:.1f} after\n")
    print("| cancel | messages | worker knew after | completed after the cancel | "
          "> 1 s after it returned | > 10 s after | ended cancelled | all ended after |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    names = {"per-request": "one per request", "batch-inline": "batch, read by the intake (before)",
             "batch": "batch, reader thread (after)"}
    for r in results:
        knew = f"{r['worker_learned_s']:.2f} s" if r.get("worker_learned_s") is not None else "-"
        print(f"| {names[r['mode']]} | {r['cancel_messages']:,} | {knew} | {r['completed_after']:,} | "
              f"{r['completed_late_1s']:,} | {r['completed_late']:,} | {r['cancelled']:,} | "
              f"{r['all_ended_s']:.1f} s |")
    if args.plot:
        plot(results, args.plot)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
