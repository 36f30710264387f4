"""`inflight models`: the model registry (schemas/registry.py) as the API and clients see it.

    inflight models             the models with live workers, one line each
    inflight models --workers   one line per live worker and model
    inflight models --all       ... with workers not heard from for INFLIGHT_REGISTRY_TTL_S
    inflight models --json      one JSON object per line (the registry records with --workers)
"""

from __future__ import annotations

import sys
import time
from typing import Any

from inflight.cli import cli_io
from inflight.schemas import Settings
from inflight.schemas.errors import BrokerError

READ_TIMEOUT_S = 15.0


def cmd_models(args: Any, settings: Settings) -> int:
    from inflight.producers.models_client import aggregate
    from inflight.transport.registry_reader import RegistryReader

    reader = RegistryReader(settings, name="cli-registry").start()
    try:
        if not reader.wait_ready(args.timeout):
            raise BrokerError(f"the model registry ({settings.topic_models}) could not be read "
                              f"within {args.timeout:g}s ({reader.error or 'no answer'})")
        now = time.time()
        records = reader.records() if args.all else reader.live(now)
    finally:
        reader.close()
    if args.workers or args.all:
        return _workers(args, records, now, settings.registry_ttl_s)
    models = sorted(aggregate(records).values(), key=lambda m: (not m.default, m.id))
    if args.json:
        for m in models:
            cli_io.out(args, "", {**m.card(), "kind": m.kind, "default": m.default,
                                  "workers": list(m.workers), "dtype": m.dtype,
                                  "quantization": m.quantization,
                                  "requests_topic": m.topics.requests,
                                  "batch_topic": m.topics.batch})
        return 0
    if not models:
        print("no model has live workers (start one: `inflight worker`)")
        return 0
    rows = [("MODEL", "KIND", "WORKERS", "MAX_MODEL_LEN", "DTYPE", "QUANT", "TOPIC")]
    rows += [(m.id + (" (default)" if m.default else "")
              + (f" <- {m.parent}" if m.parent else ""), m.kind, str(len(m.workers)),
              str(m.max_model_len or "-"), m.dtype or "-", m.quantization or "-",
              m.topics.requests) for m in models]
    _table(rows)
    return 0


def _workers(args: Any, records: list[Any], now: float, ttl: float) -> int:
    records = sorted(records, key=lambda r: (r.model, r.worker))
    if args.json:
        for r in records:
            cli_io.out(args, "", {**r.model_dump(mode="json"),
                                  "live": now - r.heartbeat_at <= ttl})
        return 0
    rows = [("MODEL", "WORKER", "LAST HEARTBEAT", "GROUP")]
    rows += [(r.model, r.worker, f"{now - r.heartbeat_at:.0f}s ago"
              + ("" if now - r.heartbeat_at <= ttl else " (gone)"), r.group) for r in records]
    _table(rows)
    return 0


def _table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        sys.stdout.write("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "\n")
    sys.stdout.flush()


def register(sub: Any) -> None:
    m = sub.add_parser("models", help="the models with live workers (the model registry)")
    m.add_argument("--workers", action="store_true", help="one line per live worker")
    m.add_argument("--all", action="store_true",
                   help="with workers not heard from within INFLIGHT_REGISTRY_TTL_S")
    m.add_argument("--timeout", type=float, default=READ_TIMEOUT_S,
                   help="how long to read the registry at most (seconds)")
    m.add_argument("--json", action="store_true")
    m.set_defaults(func=cmd_models)


def cmd_lora(args: Any, settings: Settings) -> int:
    """`inflight lora load NAME PATH | unload NAME | list` (schemas/lora.py)."""
    if args.lora_cmd == "list":
        args.workers = args.all = False
        args.json = getattr(args, "json", False)
        from inflight.producers.models_client import aggregate
        from inflight.transport.registry_reader import RegistryReader

        reader = RegistryReader(settings, name="cli-registry").start()
        try:
            if not reader.wait_ready(args.timeout):
                raise BrokerError(f"the model registry ({settings.topic_models}) could not be read "
                                  f"within {args.timeout:g}s ({reader.error or 'no answer'})")
            models = aggregate(reader.live())
        finally:
            reader.close()
        rows = [("ADAPTER", "PARENT", "WORKERS")]
        rows += [(m.id, m.parent, str(len(m.workers))) for m in sorted(models.values(), key=lambda m: m.id)
                 if m.parent]
        if len(rows) == 1:
            print("no LoRA adapter is served (load one: `inflight lora load NAME PATH`)")
        else:
            _table(rows)
        return 0
    from inflight.producers.client import Client

    with Client(settings) as client:
        client.lora_command(args.lora_cmd, args.name, getattr(args, "path", None), args.model)
    print(f"sent: LoRA {args.lora_cmd} of {args.name!r} to the workers of "
          f"{args.model or 'every model'} (`inflight lora list` shows it once they announce it)")
    return 0


def register_lora(sub: Any) -> None:
    lo = sub.add_parser("lora", help="load, unload and list LoRA adapters on running workers")
    lsub = lo.add_subparsers(dest="lora_cmd", required=True)
    ld = lsub.add_parser("load", help="workers load the PEFT folder PATH as model NAME")
    ld.add_argument("name")
    ld.add_argument("path", help="a PEFT LoRA folder the workers can read")
    ul = lsub.add_parser("unload", help="workers unload adapter NAME")
    ul.add_argument("name")
    for p in (ld, ul):
        p.add_argument("--model", default=None, help="only the workers of this base model (default: all)")
        p.set_defaults(func=cmd_lora)
    ls = lsub.add_parser("list", help="the adapters live workers serve")
    ls.add_argument("--timeout", type=float, default=READ_TIMEOUT_S)
    ls.set_defaults(func=cmd_lora)
