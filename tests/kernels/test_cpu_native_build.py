"""The C++ kernels' build cache survives processes killed in the middle of it: a finished build
is imported without entering torch's JIT, and a `lock` left by a killed builder does not make
the next process wait forever (it did: workers and CI hung at start-up behind one)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from inflight.kernels.cpu_native import build_dir, native

pytestmark = pytest.mark.skipif(native() is None, reason="the CPU kernels do not build here")

LOAD = "from inflight.kernels.cpu_native import native; m = native(); print(m.__file__)"


def _copy_build(tmp_path):
    here = build_dir()
    there = tmp_path / here.name
    shutil.copytree(here, there, ignore=shutil.ignore_patterns("build.flock"))   # mtimes kept
    (there / "lock").touch()   # torch's baton, as a builder killed by SIGKILL leaves it
    return there


def _load(tmp_path, timeout: float):
    env = dict(os.environ, INFLIGHT_KERNELS_CACHE=str(tmp_path), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-c", LOAD], env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_a_finished_build_loads_past_a_stale_lock_without_the_jit(tmp_path):
    there = _copy_build(tmp_path)
    started = time.monotonic()
    out = _load(tmp_path, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == str(there / "inflight_cpu_kernels.so")
    assert (there / "lock").exists()   # never touched: torch's JIT was not entered
    assert time.monotonic() - started < 60
