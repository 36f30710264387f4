"""Rounds of the group faults that used to wedge the worker group (tests/consumers/
group_rounds.py): a replacement started around a SIGTERM drain, a kill during a rebalance,
a joiner during a long drain. Prints rounds passed per scenario and each failure.

    OMP_NUM_THREADS=1 nice python benchmarks/group_recovery.py --rounds 20
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main() -> int:
    from inflight.cli.broker import EmbeddedBroker
    from tests.consumers.group_rounds import N_REQUESTS, SCENARIOS, run_round
    from tests.tiny_llama import write_tiny_llama

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--scenario", action="append", choices=SCENARIOS,
                   help="run only these (repeatable; default: all)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args()
    scenarios = args.scenario or list(SCENARIOS)
    work = pathlib.Path(tempfile.mkdtemp(prefix="group-rounds-"))
    model = write_tiny_llama(work / "tiny")
    results = []
    with EmbeddedBroker(log_path=work / "tansu.log") as broker:
        for rnd in range(args.rounds):
            for scenario in scenarios:
                t = time.monotonic()
                r = run_round(broker, model, work / f"{scenario}-{rnd}", scenario, rnd,
                              seed=args.seed)
                results.append(r)
                print(f"{scenario:18s} round {rnd:2d} p={r.partitions} "
                      f"{'ok  ' if r.ok else 'FAIL'} {time.monotonic() - t:5.1f}s "
                      f"{r.completed}/{N_REQUESTS} {r.notes} {r.detail}", flush=True)
    print(f"\n| scenario | rounds passed | median round s |   (load {os.getloadavg()[0]:.1f})")
    print("| --- | --- | --- |")
    for scenario in scenarios:
        rs = [r for r in results if r.scenario == scenario]
        secs = sorted(r.seconds for r in rs)
        print(f"| {scenario} | {sum(r.ok for r in rs)} / {len(rs)} | {secs[len(secs) // 2]:.0f} |")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps([r.__dict__ for r in results], indent=1))
    print(f"logs: {work}")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
