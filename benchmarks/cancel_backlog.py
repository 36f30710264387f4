"""How late a batch cancel reaches a worker that started with a backlog of cancels inside
its lookback window (a busy day's per-request cancels): the cancel reader on its own thread
(today's, consumers/cancel.py) against the reader polled by the intake thread (before:
benchmarks/batch_cancel.py's InlineCancelListener), in one run against the embedded broker.

    python benchmarks/cancel_backlog.py [--backlog 100000] [--repeats 3]

Each run: a fresh listener is made (it reads the window's backlog for at most CATCH_UP_S,
as a worker does at start), a batch cancel is sent at once, and the time until the
listener's poll() (called every 20 ms, as the intake's rounds do) hands it over is taken.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def latency(listener, client, batch_id: str, timeout: float = 120.0) -> float:
    t0 = time.monotonic()
    client.cancel_batch_requests(batch_id)
    while time.monotonic() - t0 < timeout:
        for cancel, _ in listener.poll():
            if cancel.batch_id == batch_id:
                return time.monotonic() - t0
        time.sleep(0.02)
    return float("inf")


def main() -> int:
    import orjson

    from benchmarks.batch_cancel import InlineCancelListener
    from inflight.cli.broker import EmbeddedBroker
    from inflight.consumers.cancel import CancelListener
    from inflight.producers.client import Client
    from tests.kafka_settings import make_settings

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backlog", type=int, default=100_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--only", choices=("before", "after"))
    args = p.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="cancel-backlog-"))
    rows = []
    with EmbeddedBroker(log_path=work / "tansu.log") as broker:
        settings = make_settings(broker, f"sqlite:///{work / 'db.sqlite'}", partitions=4)
        with Client(settings) as client:
            t0 = time.monotonic()
            for i in range(args.backlog):
                client.producer.send(settings.topic_cancel, key=f"r{i}".encode(),
                                     value=orjson.dumps({"request_id": f"old-{i:07d}"}))
            client.flush()
            print(f"backlog of {args.backlog:,} cancels written in {time.monotonic() - t0:.1f} s",
                  file=sys.stderr)
            for name, make in (("polled by the intake thread (before)", InlineCancelListener),
                               ("reader thread (after)", CancelListener)):
                if args.only and args.only not in name:
                    continue
                got = []
                for k in range(args.repeats):
                    t1 = time.monotonic()
                    listener = make(settings)
                    start_s = time.monotonic() - t1
                    try:
                        got.append((start_s, latency(listener, client, f"batch-{k}-{time.time()}")))
                    finally:
                        listener.close()
                    print(name, got[-1], file=sys.stderr)
                rows.append((name, got))
    print(f"\nbatch cancel sent right after a worker's cancel reader started with {args.backlog:,} "
          f"cancels inside its lookback window (4 partitions, embedded broker), "
          f"{args.repeats} runs each\n")
    print("| cancel reader | start (s, median) | batch cancel handed over after (s, median) | max (s) |")
    print("| --- | --- | --- | --- |")
    for name, got in rows:
        print(f"| {name} | {statistics.median(g[0] for g in got):.2f} | "
              f"{statistics.median(g[1] for g in got):.2f} | {max(g[1] for g in got):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
