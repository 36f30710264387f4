"""What each part of the package imports: the engine stands alone, the wire imports no torch,
a pipeline's client loads no Celery or Alembic.

`inflight.engine` and `inflight.kernels` import none of the service libraries, and the wire
(`inflight.schemas`) imports no torch: each is checked in a fresh interpreter, so nothing
another test imported first can hide a dependency. (The built wheel and its installs:
tests/test_wheel.py.)
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

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


def test_a_pipeline_client_loads_no_batch_jobs_or_migrations():
    """`import inflight.producers` (Client: submit, stream, wait, poll, cancel) loads neither
    Celery nor Alembic, nor anything of the worker or the HTTP API; a batch call or a
    migration loads them when it runs."""
    loaded = _loaded_after("import inflight.producers, inflight.store\n"
                           "from inflight.producers import Client\nClient()")
    assert "pydantic" in loaded and "sqlalchemy" in loaded
    assert not loaded & {"celery", "kombu", "alembic", "torch", "fastapi", "uvicorn"}, sorted(loaded)
