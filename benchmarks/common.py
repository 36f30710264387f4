"""Shared bits of the benchmarks: model path, workloads, tables, JSON and plots; the
service benchmarks' settings for another version, process CPU and waiting for an API."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import pathlib
import platform
import random
import subprocess
import sys
import time
import uuid

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def base_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--model", help="HF model folder (default: the bundled SmolLM2-135M-Instruct)")
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")),
                   help="torch CPU threads for both sides")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", metavar="PATH", help="write the figures as JSON")
    p.add_argument("--plot", metavar="PATH", help="save a plot (PNG)")
    return p


def model_path(arg: str | None) -> pathlib.Path:
    if arg:
        return pathlib.Path(arg)
    from inflight.cli.model import ensure_default_model

    return ensure_default_model()


def setup_torch(threads: int, seed: int) -> None:
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    random.seed(seed)


def random_tokens(rng: random.Random, n: int, vocab: int, low: int = 100) -> list[int]:
    """Ordinary (non-special) token ids: SmolLM2's specials sit below 100."""
    return [rng.randrange(low, vocab) for _ in range(n)]


def lognormal_lengths(rng: random.Random, n: int, median: float, sigma: float, lo: int, hi: int) -> list[int]:
    return [min(hi, max(lo, round(median * math.exp(rng.gauss(0.0, sigma))))) for _ in range(n)]


def percentile(values, q: float) -> float:
    vals = sorted(values)
    if not vals:
        return float("nan")
    k = (len(vals) - 1) * q / 100.0
    f, c = math.floor(k), math.ceil(k)
    return vals[f] + (vals[c] - vals[f]) * (k - f)


def machine_note() -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
            f"load avg {load:.2f} at end")


def print_table(title: str, rows: list[tuple], headers: tuple) -> None:
    cells = [tuple(fmt(c) for c in r) for r in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    print(f"\n{title}")
    print("  ".join(str(h).ljust(w) for h, w in zip(headers, widths)))
    print("  ".join("-" * w for w in widths))
    for r in cells:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))


def fmt(v) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        return f"{v:,.3f}" if abs(v) < 10 else f"{v:,.1f}"
    return str(v)


def write_json(path: str | None, data: dict) -> None:
    if path:
        pathlib.Path(path).write_text(json.dumps(data, indent=2, default=str))
        print(f"\nwrote {path}")


class Timer:
    """Wall time and this process's CPU time. NOTE: on a shared, loaded machine the CPU
    time (with one torch thread) is the steadier measure of work; report both."""

    def __enter__(self):
        self.start = time.perf_counter()
        self.cpu_start = time.process_time()
        return self

    def __exit__(self, *exc):
        self.elapsed = time.perf_counter() - self.start
        self.cpu = time.process_time() - self.cpu_start


def postgres_database(url: str):
    """A fresh database next to `url` (dropped by the returned cleanup), or None."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from inflight.store import normalize_url

    base = make_url(normalize_url(url))
    name = f"inflight_bench_{uuid.uuid4().hex[:10]}"
    admin = create_engine(base.set(database="postgres"), isolation_level="AUTOCOMMIT",
                          connect_args={"connect_timeout": 5})
    try:
        with admin.connect() as c:
            c.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:  # noqa: BLE001 - no server: the Postgres row is skipped
        admin.dispose()
        print(f"(Postgres skipped: {type(exc).__name__}: {str(exc).splitlines()[0]})")
        return None, None

    def drop():
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return base.set(database=name).render_as_string(hide_password=False), drop


def explicit_env(s) -> dict[str, str]:
    """INFLIGHT_* of the settings this benchmark sets, nothing else: another version's
    processes keep their own defaults (e.g. the old INFLIGHT_API_MAX_STREAMS)."""
    from inflight.cli.commands import settings_env

    return {k: v for k, v in settings_env(s).items()
            if k[len("INFLIGHT_"):].lower() in s.model_fields_set}


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) the process has used so far."""
    import psutil

    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def wait_api(url: str, proc: subprocess.Popen, timeout: float, path: str = "/healthz") -> None:
    """Until `url + path` answers 200; RuntimeError when the API exits or `timeout` passes."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the API exited with {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + path, timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"the API did not answer 200 on {path}")
