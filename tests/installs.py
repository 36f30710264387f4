"""Installs of what ships, made fast: the built wheel, a fresh virtualenv, and only the
dependencies an install would get, taken from the dev environment instead of downloaded.

    wheel = build_wheel(tmp)                          # `pip wheel` of a copy of the tree
    venv = Venv.create(tmp / "full", link_site(tmp / "deps"))          # every installed dist
    venv = Venv.create(tmp / "base", link_site(tmp / "deps", dists))   # only these dists

A venv sees its dependencies through a `.pth` line naming a folder of symlinks to the dev
environment's site-packages entries (its `.pth` files are not run there, so no editable
finder of the dev install comes along); this project's own dev install (`inflight`'s
dist-info, the `__editable__` finder) is never linked. pip then installs the wheel into
the venv's own site-packages as any user's pip would, with `PIP_NO_INDEX` so a requirement
the linked folder cannot satisfy fails instead of being downloaded.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
NOT_SHIPPED = {"tests", "benchmarks"}
# this project's dev install: never linked into a venv that tests the wheel
OWN_INSTALL = re.compile(r"^(inflight-[^/]*\.dist-info|__editable__.*|inflight)$")


def package_folders() -> list[Path]:
    """The source tree's top-level package folders (each installs as inflight.<folder>)."""
    return sorted(p for p in ROOT.iterdir()
                  if (p / "__init__.py").is_file() and p.name not in NOT_SHIPPED)


def source_files() -> dict[str, Path]:
    """{path in the wheel: source file} for every file the source tree ships: each file of
    a package folder that git does not ignore (tracked or new; git's list when there is a
    repository, else the folders' files)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard",
                              *(p.name for p in package_folders())],
                             cwd=ROOT, capture_output=True, check=True).stdout.decode()
        files = [ROOT / f for f in out.split("\0") if f and (ROOT / f).is_file()]
    except (OSError, subprocess.CalledProcessError):
        files = [f for p in package_folders() for f in p.rglob("*") if f.is_file()
                 and "__pycache__" not in f.parts]
    shipped = {}
    for f in files:
        rel = f.relative_to(ROOT)
        inside = rel.parts[1:] if rel.parts[0] == "inflight" else rel.parts
        shipped["/".join(("inflight", *inside))] = f
    return shipped


def build_wheel(out: Path) -> Path:
    """`pip wheel` of a copy of the source tree (setuptools keeps a build/ folder in the
    tree it builds, whose stale files would land in later wheels)."""
    src = out / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis",
        "control", ".whl", ".gpu", "out", ".cache"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                           "--no-build-isolation", "--disable-pip-version-check", "-w", str(out),
                           str(src)], capture_output=True, text=True, cwd=out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = out.glob("inflight-*.whl")
    return wheel


def dev_site_dirs() -> list[Path]:
    """The dev environment's site-packages folders, in import order."""
    return [Path(p) for p in sys.path if p.rstrip("/").endswith("site-packages")
            and Path(p).is_dir() and not Path(p).resolve().is_relative_to(ROOT)]


def dependency_closure(requirements: list[str]) -> set[str]:
    """Normalized names of the installed distributions `requirements` need, transitively
    (markers evaluated here, extras followed): what pip would install for them."""
    seen: set[str] = set()
    todo = [(Requirement(r), "") for r in requirements]
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        name = _norm(req.name)
        dist = metadata.distribution(req.name)
        key = f"{name}[{','.join(sorted(req.extras))}]"
        if key in seen:
            continue
        seen.add(key)
        for child in dist.requires or []:
            for e in ("", *req.extras):
                todo.append((Requirement(child), e))
    return {k.split("[")[0] for k in seen}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def link_site(folder: Path, dists: set[str] | None = None) -> Path:
    """A folder of symlinks to the dev environment's site-packages entries: all of them,
    or only the files of `dists` (normalized names) and their dist-info."""
    folder.mkdir(parents=True)
    wanted: set[str] | None = None
    if dists is not None:
        wanted = set()
        for dist in metadata.distributions():
            if _norm(dist.metadata["Name"]) in dists:
                wanted |= {f.parts[0] for f in dist.files or [] if f.parts[0] != ".."}
    for site in dev_site_dirs():
        for entry in site.iterdir():
            name = entry.name
            if (OWN_INSTALL.match(name) or name.endswith((".pth", ".egg-link"))
                    or (folder / name).exists() or (wanted is not None and name not in wanted)):
                continue
            (folder / name).symlink_to(entry)
    return folder


@dataclass
class Venv:
    path: Path

    @classmethod
    def create(cls, path: Path, deps: Path) -> "Venv":
        """A fresh venv (no pip of its own: pip comes with `deps` or runs from outside)
        that sees `deps` after its own site-packages."""
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
        venv = cls(path)
        (venv.site / "zz_linked_deps.pth").write_text(f"{deps}\n")
        return venv

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    @property
    def site(self) -> Path:
        rel = Path(sysconfig.get_path("purelib")).relative_to(sysconfig.get_path("data"))
        return self.path / rel

    def bin(self, name: str) -> Path:
        return self.path / "bin" / name

    def env(self, **extra: str) -> dict[str, str]:
        """A clean environment for the venv's programs: no PYTHONPATH (nothing of the
        source tree), pip offline, the venv's bin first on PATH."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PYTHON", "PIP_", "INFLIGHT_", "VIRTUAL_ENV"))}
        env.update(PATH=f"{self.path / 'bin'}:{env.get('PATH', '')}", VIRTUAL_ENV=str(self.path),
                   PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", **extra)
        return env

    def run(self, *argv: str | Path, cwd: Path, timeout: float = 300, check: bool = True,
            **env: str) -> subprocess.CompletedProcess:
        proc = subprocess.run([str(a) for a in argv], cwd=cwd, env=self.env(**env),
                              capture_output=True, text=True, timeout=timeout)
        if check:
            assert proc.returncode == 0, f"{argv}: rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        return proc

    def pip(self, *args: str | Path, cwd: Path) -> subprocess.CompletedProcess:
        """The dev environment's pip acting on this venv (`pip --python`)."""
        return self.run(sys.executable, "-m", "pip", "--python", self.python, *args, cwd=cwd)
