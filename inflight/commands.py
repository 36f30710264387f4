"""Service subcommands (submit, result, stream, worker, recorder, demo).

Filled in by the service issue; until then `demo` runs the parts that exist and says so.
"""

from __future__ import annotations


def register(sub) -> None:
    from inflight import demo

    d = sub.add_parser("demo", help="the whole path on embedded defaults: broker, worker, recorder, SQLite, SmolLM2")
    d.add_argument("--model", default=None, help="a local Hugging Face folder instead of the bundled model")
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=demo.run)
