"""`inflight embed FILE`: one text per line in, one JSON line per text out, through the
queue (Client.embed: kind "embed" requests to an embedding model's workers).

    inflight embed passages.txt --model all-MiniLM-L6-v2 --out vectors.jsonl
    {"line": 1, "embedding": [0.0123, ...]}

Blank lines are skipped (their numbers are kept: `line` is the 1-based line of the file).
The file is read and answered in chunks of --chunk lines, so memory stays bounded by a
chunk whatever the file's length; each chunk's lines are written as soon as it is done.
"""

from __future__ import annotations

import sys
from typing import Any

import orjson

from inflight.cli import cli_io
from inflight.schemas import Settings


def _chunks(f, size: int):
    chunk: list[tuple[int, str]] = []
    for n, line in enumerate(f, 1):
        text = line.rstrip("\r\n")
        if not text.strip():
            continue
        chunk.append((n, text))
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def cmd_embed(args: Any, settings: Settings) -> int:
    client = cli_io.client(settings)
    out = open(args.out, "wb") if args.out else sys.stdout.buffer
    total = 0
    try:
        with open(args.file, encoding="utf-8") as f:
            for chunk in _chunks(f, args.chunk):
                vectors = client.embed([t for _, t in chunk], model=args.model,
                                       dimensions=args.dimensions, timeout=args.timeout)
                out.write(b"".join(orjson.dumps({"line": n, "embedding": v}) + b"\n"
                                   for (n, _), v in zip(chunk, vectors)))
                out.flush()
                total += len(chunk)
    finally:
        if args.out:
            out.close()
        client.close()
    if args.out:
        cli_io.out(args, f"embedded {total} lines of {args.file} into {args.out}",
                   {"embedded": total, "out": args.out})
    return 0


def register(sub: Any) -> None:
    e = sub.add_parser("embed", help="embed a file, one text per line, into JSONL vectors")
    e.add_argument("file")
    e.add_argument("--model", default=None, help="an embedding model (default: the default model)")
    e.add_argument("--dimensions", type=int, default=None, help="cut each vector to N (Matryoshka)")
    e.add_argument("--out", default=None, help="write the JSONL here (default: stdout)")
    e.add_argument("--chunk", type=int, default=1000, help="lines in flight at once (1000)")
    e.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for a chunk")
    e.add_argument("--json", action="store_true")
    e.set_defaults(func=cmd_embed)
