"""No benchmark script may shadow a package: `python benchmarks/X.py` puts benchmarks/ first
on sys.path, so a benchmarks/kernels.py made `import kernels.ops` fail ('kernels' is not a
package) whenever the project root was on the path too."""

import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_benchmark_files_do_not_shadow_packages():
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    scripts = {p.stem for p in (ROOT / "benchmarks").rglob("*.py")}
    assert {"engine", "kernels", "schemas"} <= packages and "throughput" in scripts
    assert not scripts & packages, f"rename benchmarks/{sorted(scripts & packages)}.py"
