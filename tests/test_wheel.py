"""What ships, installed as a user installs it: the built wheel in fresh virtualenvs, the
source tree and the dev install's editable finder nowhere on their path.

- the wheel holds every module and data file of the source tree, under one `inflight`;
- `full`: the wheel installed by the image's own install line (the Dockerfile's
  `deploy/install.sh /wheels EXTRAS`, under constraints.txt), every dependency resolved
  offline from the dev environment: every module imports; the demo runs (broker, worker,
  recorder, Celery jobs, prompts completed) and prints no warning; the services start;
- `base`: the wheel alone, with only its base dependencies: it resolves without torch,
  the HTTP server or Celery, and a pipeline in it gets a completed result from a service
  that runs from `full`; a command that needs an extra says which (exit 2).

Dependencies come from the dev environment (tests/installs.py), so this costs about a
minute, not a download.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.deploy.files import dockerfile_instructions
from tests.installs import (ROOT, Venv, build_wheel, dependency_closure, link_site, source_files)

NOT_IN_BASE = ("torch", "triton", "transformers", "gguf", "accelerate", "llguidance", "fastapi",
               "uvicorn", "celery")
NOT_IMPORTED = (".__main__", "inflight.migrations.env")  # a program; Alembic's script


def image_install() -> tuple[str, str]:
    """(script, extras) of the Dockerfile's runtime install: `RUN sh .../deploy/install.sh
    /wheels EXTRAS`, the line this module installs `full` with."""
    runs = [args.split() for word, args in dockerfile_instructions() if word == "RUN"]
    (line,) = [r for r in runs if any(w.endswith("deploy/install.sh") for w in r)]
    i = next(i for i, w in enumerate(line) if w.endswith("deploy/install.sh"))
    assert line[i + 1] == "/wheels", line
    return "deploy/install.sh", line[i + 2]


def base_requirements(wheel: Path) -> list[str]:
    meta = Parser().parsestr(zipfile.ZipFile(wheel).read(
        "inflight-0.1.0.dist-info/METADATA").decode())
    reqs = [Requirement(r) for r in meta.get_all("Requires-Dist")]
    return [str(r) for r in reqs if r.marker is None or r.marker.evaluate({"extra": ""})]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def full(wheel, tmp_path_factory) -> Venv:
    tmp = tmp_path_factory.mktemp("full")
    venv = Venv.create(tmp / "venv", link_site(tmp / "deps"))
    script, extras = image_install()
    venv.run("sh", ROOT / script, wheel.parent, extras, cwd=tmp, PYTHON=str(venv.python))
    return venv


@pytest.fixture(scope="module")
def base(wheel, tmp_path_factory) -> Venv:
    tmp = tmp_path_factory.mktemp("base")
    dists = dependency_closure(base_requirements(wheel))
    assert not dists & set(NOT_IN_BASE), sorted(dists & set(NOT_IN_BASE))
    venv = Venv.create(tmp / "venv", link_site(tmp / "deps", dists))
    venv.pip("install", wheel, cwd=tmp)  # offline: fails if a base requirement is not linked
    venv.pip("check", cwd=tmp)
    return venv


def test_the_wheel_holds_every_module_and_data_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = source_files()
    assert "inflight/engine/parallel/launch.py" in shipped  # the one that went missing once
    assert "inflight/migrations/alembic.ini" in shipped and "inflight/cli/main.py" in shipped
    missing = sorted(set(shipped) - names)
    assert not missing, missing
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"inflight"}, sorted(top)
    extra = sorted(n for n in names if n.startswith("inflight/") and n not in shipped)
    assert not extra, extra  # nothing the tree does not track (build leftovers, tests)
    entry = zipfile.ZipFile(wheel).read("inflight-0.1.0.dist-info/entry_points.txt").decode()
    assert "inflight = inflight.cli.main:main" in entry


PROBE = """
import importlib, json, pkgutil, sys
import inflight
skip = %r
names, failed = [], {}
for m in pkgutil.walk_packages(inflight.__path__, "inflight."):
    if m.name.endswith(skip[0]) or m.name in skip[1:]:
        continue
    try:
        importlib.import_module(m.name)
        names.append(m.name)
    except Exception as exc:
        failed[m.name] = repr(exc)
print(json.dumps({"file": inflight.__file__, "imported": names, "failed": failed,
                  "finders": [repr(f) for f in sys.meta_path], "path": sys.path}))
"""


def test_every_module_imports_from_the_installed_wheel(full, tmp_path):
    out = json.loads(full.run(full.python, "-c", PROBE % (NOT_IMPORTED,), cwd=tmp_path).stdout)
    assert out["file"] == str(full.site / "inflight" / "__init__.py")
    assert not [p for p in out["path"] if p and Path(p).resolve().is_relative_to(ROOT)]
    assert not [f for f in out["finders"] if "editable" in f.lower()]
    assert not out["failed"], out["failed"]
    modules = {n.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
               for n in source_files() if n.endswith(".py")}
    want = {m for m in modules if m != "inflight" and not m.endswith(NOT_IMPORTED[0])
            and m not in NOT_IMPORTED[1:]}
    assert set(out["imported"]) == want, sorted(want ^ set(out["imported"]))


def test_the_demo_runs_from_the_installed_wheel_and_warns_of_nothing(full, tiny_model, tmp_path):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    proc = full.run(full.bin("inflight"), "demo", "--model", tiny_model, "--max-tokens", "4",
                    "--json", "--data-dir", tmp_path / "data", cwd=cwd, timeout=240,
                    HOME=str(tmp_path), OMP_NUM_THREADS="1", INFLIGHT_KERNELS_CACHE=KERNELS_CACHE)
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["ok"] and len(report["results"]) == 4, report
    assert report["batch"]["status"] == "completed"
    output = proc.stdout + proc.stderr
    assert "Warning" not in output and " WARNING " not in output, output[-3000:]
    assert not list(cwd.iterdir())  # nothing in the working directory (kombu's ./control)


def _kernels_cache() -> str:
    """Where this checkout's C++ kernels are built (the wheel holds the same sources, so its
    services import that build): with HOME moved each service would rebuild them, minutes."""
    from inflight.kernels.cpu_native import build_dir

    return str(build_dir().parent)


KERNELS_CACHE = _kernels_cache()


class Services:
    """`inflight broker`, `worker`, `recorder` from one venv, their logs in files."""

    def __init__(self, venv: Venv, tmp: Path):
        self.venv, self.tmp, self.procs = venv, tmp, {}
        self.env: dict[str, str] = {
            "HOME": str(tmp), "OMP_NUM_THREADS": "1", "INFLIGHT_METRICS_INTERVAL_S": "0",
            "INFLIGHT_KERNELS_CACHE": KERNELS_CACHE,
            "INFLIGHT_DATABASE_URL": f"sqlite:///{tmp / 'inflight.db'}",
            "INFLIGHT_DATA_DIR": str(tmp / "data"), "INFLIGHT_CACHE_DIR": str(tmp / "cache"),
            "INFLIGHT_KAFKA_SESSION_TIMEOUT_MS": "2000",  # Tansu: a join takes about half
            "INFLIGHT_KAFKA_HEARTBEAT_INTERVAL_MS": "500"}

    def start(self, name: str, *argv: str | Path) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "wb")
        self.procs[name] = subprocess.Popen([str(self.venv.bin("inflight")), *map(str, argv)],
                                            cwd=self.tmp, env=self.venv.env(**self.env),
                                            stdout=log, stderr=subprocess.STDOUT)
        return self.procs[name]

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def broker(self) -> str:
        proc = self.start("broker", "broker", "--json")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            for line in self.log("broker").splitlines():
                if line.startswith("{"):
                    self.env["INFLIGHT_KAFKA_BOOTSTRAP"] = json.loads(line)["bootstrap"]
                    return self.env["INFLIGHT_KAFKA_BOOTSTRAP"]
            time.sleep(0.1)
        raise AssertionError(f"`inflight broker` did not start:\n{self.log('broker')}")

    def stop(self) -> None:
        for proc in reversed(list(self.procs.values())):  # the broker last
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


PIPELINE = """
import importlib.util, json, sys
from inflight.producers import Client
from inflight.schemas import Settings
from inflight.schemas.errors import MissingExtraError

with Client(Settings()) as client:
    rid = client.submit("a pipeline asks", {"max_tokens": 4, "temperature": 0})
    result = client.wait(rid, timeout=120)
    try:
        client.create_batch(b'{"custom_id": "a", "body": {}}\\n')
        batch = "created"
    except MissingExtraError as exc:
        batch = exc.extra
try:
    from inflight.engine import Engine
    engine = "imported"
except MissingExtraError as exc:
    engine = exc.extra
print(json.dumps({"status": result.status, "text": result.text, "batch": batch,
                  "engine": engine,
                  "loaded": sorted(m for m in %r if m in sys.modules),
                  "installed": sorted(m for m in %r if importlib.util.find_spec(m))}))
"""


@pytest.mark.broker
def test_a_base_install_pipeline_gets_a_result_from_services_of_the_wheel(base, full, tiny_model,
                                                                          tmp_path):
    services = Services(full, tmp_path)
    try:
        services.broker()
        base.run(base.bin("inflight"), "db", "upgrade", cwd=tmp_path, **services.env)
        services.start("worker", "worker", "--model", tiny_model, "--kv-cache-mb", "16")
        services.start("recorder", "recorder")
        out = base.run(base.python, "-c", PIPELINE % (NOT_IN_BASE, NOT_IN_BASE), cwd=tmp_path,
                       timeout=180, **services.env)
        report = json.loads(out.stdout.strip().splitlines()[-1])
        assert report["status"] == "completed" and report["text"], (report, services.log("worker"))
        assert report["loaded"] == [] and report["installed"] == [], report
        assert report["batch"] == "jobs" and report["engine"] == "worker", report
        # the command line of the base install: submit and wait; a service says its extra
        cli = base.run(base.bin("inflight"), "submit", "from the command line", "--max-tokens",
                       "3", "--wait", "--json", cwd=tmp_path, **services.env)
        assert json.loads(cli.stdout.splitlines()[-1])["status"] == "completed"
        for command, extra in (("worker", "worker"), ("api", "api"), ("jobs", "jobs")):
            proc = base.run(base.bin("inflight"), command, cwd=tmp_path, check=False,
                            **services.env)
            assert proc.returncode == 2 and f"pip install 'inflight[{extra}]'" in proc.stderr, (
                command, proc.stderr[-2000:])
    finally:
        services.stop()
    # each service said what it serves, once
    assert services.log("worker").count(" serving tiny") == 1, services.log("worker")[-3000:]
    assert services.log("recorder").count("INFO inflight.recorder recorder: ") == 1
    assert "alembic" not in services.log("recorder")
