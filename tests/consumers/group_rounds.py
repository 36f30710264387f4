"""Rounds of the group-membership faults that used to wedge a consumer group, on the real
embedded broker with worker processes (tests.consumers.slow_worker), a recorder and SQLite.

    sigterm_join        SIGTERM a worker with requests in flight; its replacement starts
                        around the drain (a little before to a little after the signal)
    kill_in_rebalance   two workers serve; a third joins and, while that rebalance is under
                        way, one of the first two is killed (SIGKILL)
    long_drain_join     SIGTERM a worker whose requests take ~11 s; a joiner must get
                        partitions during the drain

A round passes when every request ends with a completed row in the store within its
deadline. tests/consumers/test_group_recovery.py runs a few rounds (CI);
benchmarks/group_recovery.py runs many and prints the table.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from inflight.schemas import SamplingParams

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = ("sigterm_join", "kill_in_rebalance", "long_drain_join")
N_REQUESTS = 24
ASSIGNED_RE = re.compile(r"^(\S+ \S+) .* assigned \[(.*)\]")


@dataclass
class RoundResult:
    scenario: str
    round: int
    partitions: int
    ok: bool
    seconds: float
    completed: int
    detail: str = ""
    notes: dict = field(default_factory=dict)


def start_worker(settings, model: Path, log: Path, step_ms: float = 10.0) -> subprocess.Popen:
    from inflight.cli.commands import settings_env

    env = {**os.environ, **settings_env(settings), "OMP_NUM_THREADS": "1",
           "INFLIGHT_METRICS_INTERVAL_S": "0", "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "tests.consumers.slow_worker", "--model",
                             str(model), "--step-ms", str(step_ms)], env=env, cwd=REPO,
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT)


def assignments(log: Path) -> list[tuple[str, int]]:
    """(time stamp, number of partitions) of each assignment the worker logged."""
    out = []
    if not log.exists():
        return out
    for line in log.read_text(errors="replace").splitlines():
        m = ASSIGNED_RE.match(line)
        if m:
            out.append((m.group(1), len([p for p in m.group(2).split(",") if p.strip()])))
    return out


def _wait(cond, timeout: float, what: str, step: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(step)


def _logged(log: Path, text: str) -> bool:
    return log.exists() and text in log.read_text(errors="replace")


def run_round(broker, model: Path, workdir: Path, scenario: str, rnd: int, *,
              partitions: int | None = None, seed: int = 0,
              deadline_s: float = 120.0) -> RoundResult:
    from inflight.producers.client import Client
    from inflight.store import FINAL_STATUSES, Store
    from tests.consumers.conftest import Service, make_settings

    rng = random.Random(seed * 1000 + rnd)
    partitions = partitions or (2, 4)[rnd % 2]
    workdir.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{workdir / 'store.db'}"
    store = Store(url, create=True)
    long_drain = scenario == "long_drain_join"
    settings = make_settings(broker, url, partitions=partitions, worker_max_inflight=8,
                             worker_drain_timeout_s=30.0)
    recorder = Service(settings, None, store, worker=False)
    client = Client(settings, store=store)
    procs: dict[str, subprocess.Popen] = {}
    logs = {name: workdir / f"{name}.log" for name in "ABC"}
    notes: dict = {}
    t0 = time.monotonic()
    ids: list[str] = []

    def completed() -> int:
        return sum(r.status == "completed" for r in store.get_requests(ids).values())

    def final() -> int:
        return sum(r.status in FINAL_STATUSES for r in store.get_requests(ids).values())

    try:
        step_ms = 25.0 if long_drain else 10.0  # the tiny model's context is 512 tokens

        def start(name: str) -> None:
            procs[name] = start_worker(settings, model, logs[name], step_ms)

        start("A")
        if scenario == "kill_in_rebalance":
            start("B")
        _wait(lambda: all(assignments(logs[n]) and assignments(logs[n])[-1][1] for n in procs),
              180, "the first workers were never assigned partitions")
        tokens = rng.randint(400, 480) if long_drain else rng.randint(150, 480)
        notes["max_tokens"] = tokens
        params = SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=0)
        ids = client.submit_many([f"one two three {i}" for i in range(N_REQUESTS)], params,
                                 progress=False)
        if scenario == "kill_in_rebalance":
            _wait(lambda: completed() >= 4, 90, "no request completed")
            start("C")
            _wait(lambda: _logged(logs["C"], "max_inflight="), 90, "C never opened")
            delay = rng.uniform(0.0, 1.5)  # C's join is on its way: kill inside the rebalance
            time.sleep(delay)
            victim = rng.choice("AB")
            procs[victim].send_signal(signal.SIGKILL)
            procs[victim].wait(10)
            notes.update(kill_after_open_s=round(delay, 2), killed=victim)
        else:
            _wait(lambda: completed() >= (1 if long_drain else 8), 120, "no request completed")
            lead = rng.uniform(-3.0, 1.0)  # B's process start relative to the SIGTERM
            if lead < 0:
                start("B")
                time.sleep(-lead)
            procs["A"].send_signal(signal.SIGTERM)
            term_at = time.monotonic()
            if lead >= 0:
                time.sleep(lead)
                start("B")
            notes["b_start_s"] = round(lead, 2)
            if long_drain:  # the joiner must serve while A still drains
                _wait(lambda: any(n for _, n in assignments(logs["B"])) or procs["A"].poll() is not None,
                      60, "neither B assigned nor A gone")
                notes["b_assigned_in_drain"] = procs["A"].poll() is None
            procs["A"].wait(60)
            notes["drain_s"] = round(time.monotonic() - term_at, 1)
        end = time.monotonic() + deadline_s
        while final() < len(ids) and time.monotonic() < end:
            time.sleep(0.2)
        done = completed()
        ok = done == len(ids)
        if long_drain and not notes.get("b_assigned_in_drain"):
            ok = False
        detail = "" if ok else (f"{len(ids) - done} of {len(ids)} not completed; assignments: "
                                + "; ".join(f"{n}={assignments(logs[n])}" for n in procs))
        return RoundResult(scenario, rnd, partitions, ok, time.monotonic() - t0, done, detail, notes)
    except TimeoutError as exc:
        return RoundResult(scenario, rnd, partitions, False, time.monotonic() - t0,
                           completed() if ids else 0, f"timed out: {exc}", notes)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(40)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        recorder.stop()
        client.close()
        store.close()
