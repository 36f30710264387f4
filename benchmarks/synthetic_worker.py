"""One worker process on the synthetic engine, for `benchmarks/service.py --engine synthetic`.

    PYTHONPATH=<tree> python benchmarks/synthetic_worker.py --report PATH [--max-num-seqs N]
        [--step-ms MS] [--tokens-per-step K]

The worker is whichever tree's `consumers.worker` comes first on PYTHONPATH (this tree, or
commit f1e85d1 checked out elsewhere: the "before" of the benchmark); settings come from
INFLIGHT_*. Every 0.2 s and at exit it writes the engine's counters and this process's CPU
seconds (all threads, and per thread by name) to the JSON file `--report`. SIGTERM stops it gracefully.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import threading
import time

from synthetic_engine import SyntheticEngine  # benchmarks/ (this script's folder)


def thread_cpu() -> dict[str, float]:
    """CPU seconds per thread, by Python thread name; threads Python does not know (a C
    library's, e.g. librdkafka's) are summed as "native"."""
    import psutil

    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for t in psutil.Process().threads():
        name = names.get(t.id, "native")
        out[name] = out.get(name, 0.0) + t.user_time + t.system_time
    return out


def report(path: pathlib.Path, engine: SyntheticEngine) -> None:
    t = os.times()
    data = {"first_add": engine.first_add, "last_finish": engine.last_finish,
            "tokens": engine.tokens, "finished": engine.finished, "steps": engine.steps,
            "cpu_s": t.user + t.system, "threads": thread_cpu(), "at": time.time()}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--report", required=True, type=pathlib.Path)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--step-ms", type=float, default=1.0)
    p.add_argument("--tokens-per-step", type=int, default=1)
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    import inflight.engine  # noqa: F401 - torch and the engine package load now, not at the first request

    import inflight.consumers.worker as worker_module
    from inflight.consumers.worker import Worker
    from inflight.schemas import Settings

    eng = SyntheticEngine(max_num_seqs=args.max_num_seqs, step_s=args.step_ms / 1000,
                          tokens_per_step=args.tokens_per_step)
    worker = Worker(Settings(), eng)
    worker.install_signal_handlers()
    settle = getattr(worker_module, "settle_heap", None)  # absent from older trees
    if settle is not None:
        settle()
    stop = threading.Event()

    def reporter():
        while not stop.wait(0.2):
            report(args.report, eng)

    threading.Thread(target=reporter, name="reporter", daemon=True).start()
    try:
        worker.run()
    finally:
        stop.set()
        report(args.report, eng)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
