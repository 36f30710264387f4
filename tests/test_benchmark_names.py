"""No benchmark script may shadow the package: `python benchmarks/X.py` puts benchmarks/
first on sys.path, so a benchmarks/inflight.py (or tests.py) would hide the real package
from every import of the script."""

import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_benchmark_files_do_not_shadow_packages():
    scripts = {p.stem for p in (ROOT / "benchmarks").rglob("*.py")}
    assert "throughput" in scripts
    assert not scripts & {"inflight", "tests"}, f"rename benchmarks/{sorted(scripts & {'inflight', 'tests'})}.py"
