"""Processes seen through /proc (Linux): is a pid still running, who are its children."""

from __future__ import annotations

import time
from pathlib import Path


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()  # state, ppid, ... (the name may hold spaces)


def alive(pid: int) -> bool:
    """Running (a zombie, exited but not reaped yet, counts as gone)."""
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z"


def wait_gone(pids: list[int], timeout: float = 15.0) -> list[int]:
    """Wait until none of `pids` runs; returns those still running at the timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids):
            return []
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            stat = _stat(int(d.name))
            if stat is not None and int(stat[1]) == pid:
                out.append(int(d.name))
    return out
