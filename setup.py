"""Which packages the wheel holds: found, never listed.

One top-level import package, `inflight`: every folder of the layout that is a package
(an `__init__.py`; tests and benchmarks excepted) installs as `inflight.<folder>`
(engine/ -> inflight.engine), and each of its subpackages under it (engine/parallel ->
inflight.engine.parallel), found by setuptools' `find_packages`. inflight/ holds the
package's own __init__ and the command line (inflight.cli). Everything else about the
distribution is in pyproject.toml; tests/test_wheel.py checks that the built wheel holds
every module and data file of the source tree.
"""

from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent
NOT_SHIPPED = ("tests", "benchmarks", "build", "dist")


def layout() -> tuple[dict[str, str], list[str]]:
    """(package_dir, packages): each top-level package folder mapped to inflight.<folder>."""
    package_dir: dict[str, str] = {}
    packages: list[str] = []
    for folder in sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()):
        if folder in NOT_SHIPPED:
            continue
        name = "inflight" if folder == "inflight" else f"inflight.{folder}"
        package_dir[name] = folder
        packages.append(name)
        packages += [f"{name}.{sub}" for sub in find_packages(str(ROOT / folder))]
    return package_dir, packages


package_dir, packages = layout()
setup(package_dir=package_dir, packages=packages)
