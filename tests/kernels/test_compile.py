"""The Triton kernels compile for sm_90 (H100/H200) in bf16 (8-bit KV caches too), with no GPU: the interpreter
tests cannot see compile-only errors. Runs in a subprocess without TRITON_INTERPRET."""

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, str(ROOT / "tests/kernels/compile_sm90.py"), "--quick", "bf16"],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("\n") == 12, proc.stdout  # 8 + int8 and fp8 KV: attention, write
