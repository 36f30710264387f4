"""Write (or check) the committed JSON Schemas of the current schema version.

    python -m inflight.schemas.export            # writes schemas/json/v<N>/
    python -m inflight.schemas.export --check    # exit 1, listing the files that differ
    python -m inflight.schemas.export --out DIR  # somewhere else

Only the current version's folder is written; earlier versions' folders are frozen.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from inflight.schemas.base import SCHEMA_VERSION
from inflight.schemas.contract import CONTRACT_DIR, render


def dumps(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False) + "\n"


def drift(root: Path = CONTRACT_DIR, version: int = SCHEMA_VERSION) -> list[str]:
    """The files of version `version` under `root` that differ from the generated ones
    (missing, changed, or committed but no longer generated)."""
    folder = root / f"v{version}"
    want = {path: dumps(body) for path, body in render(version).items()}
    out = []
    for path, text in want.items():
        f = folder / path
        if not f.is_file():
            out.append(f"{path}: missing")
        elif f.read_text() != text:
            out.append(f"{path}: differs")
    if folder.is_dir():
        for f in folder.rglob("*.json"):
            rel = f.relative_to(folder).as_posix()
            if rel not in want:
                out.append(f"{rel}: not generated any more")
    return sorted(out)


def write(root: Path = CONTRACT_DIR, version: int = SCHEMA_VERSION) -> list[Path]:
    folder = root / f"v{version}"
    written = []
    for path, body in render(version).items():
        f = folder / path
        f.parent.mkdir(parents=True, exist_ok=True)
        text = dumps(body)
        if not f.is_file() or f.read_text() != text:
            f.write_text(text)
            written.append(f)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m inflight.schemas.export", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true",
                    help="compare with the committed files; exit 1 when they differ")
    ap.add_argument("--out", type=Path, default=CONTRACT_DIR,
                    help=f"the folder holding v<N>/ (default {CONTRACT_DIR})")
    args = ap.parse_args(argv)
    if args.check:
        diffs = drift(args.out)
        for d in diffs:
            print(f"v{SCHEMA_VERSION}/{d}", file=sys.stderr)
        if diffs:
            print("the committed JSON Schemas drifted from the wire models: run "
                  "`python -m inflight.schemas.export` and commit schemas/json/", file=sys.stderr)
        return 1 if diffs else 0
    for f in write(args.out):
        print(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
