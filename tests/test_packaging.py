"""The distribution installs one top-level package, `inflight`, and its engine stands alone.

`inflight.engine` and `inflight.kernels` import none of the service libraries, and the wire
(`inflight.schemas`) imports no torch: each is checked in a fresh interpreter, so nothing
another test imported first can hide a dependency.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys
import zipfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
SERVICE_LIBS = ("pydantic", "pydantic_settings", "kafka", "confluent_kafka", "sqlalchemy",
                "fastapi", "celery", "orjson", "alembic", "uvicorn")


def _loaded_after(code: str) -> set[str]:
    """Top-level module names loaded by `code` in a fresh interpreter."""
    probe = code + "\nimport sys; print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"
    out = subprocess.run([sys.executable, "-c", probe], cwd="/", capture_output=True, text=True,
                         check=True)
    return set(out.stdout.split())


def test_engine_and_kernels_import_without_the_service_stack():
    code = """
import importlib, pkgutil
import inflight.engine, inflight.kernels
from inflight.engine import Engine, EngineConfig, RequestOutput, SamplingParams
for pkg in (inflight.engine, inflight.kernels):
    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        importlib.import_module(m.name)
"""
    loaded = _loaded_after(code)
    assert "torch" in loaded  # the probe really loaded the engine
    assert not loaded & set(SERVICE_LIBS), sorted(loaded & set(SERVICE_LIBS))


def test_the_wire_imports_no_torch():
    loaded = _loaded_after("import inflight.schemas, inflight.transport.kafka_clients")
    assert "pydantic" in loaded and "torch" not in loaded


def test_the_wheel_holds_one_top_level_package(tmp_path):
    # built from a copy: setuptools keeps a build/ folder in the source tree, whose stale
    # files would land in the wheel and in later builds
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis",
        "control", ".whl", ".gpu", "out"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "-w", str(tmp_path), str(src)],
                   check=True, capture_output=True, cwd=tmp_path)
    (wheel,) = tmp_path.glob("inflight-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"inflight"}, sorted(top)
    for sub in ("engine", "kernels", "schemas", "store", "transport", "consumers", "producers", "api",
                "migrations", "cli"):
        assert f"inflight/{sub}/__init__.py" in names, sub
    assert "inflight/migrations/alembic.ini" in names and "inflight/migrations/script.py.mako" in names
