"""`inflight api` (serve the HTTP API), `inflight keys create NAME / update ID / list /
revoke ID` and `inflight usage`."""

from __future__ import annotations

import logging
from typing import Any

from inflight.cli import cli_io
from inflight.schemas import Settings


def _key_dict(info: Any) -> dict[str, Any]:
    return {"id": info.id, "name": info.name, "owner": info.owner,
            "created_at": info.created_at.isoformat(),
            "revoked_at": info.revoked_at.isoformat() if info.revoked_at else None,
            "rpm": info.rpm, "tpm": info.tpm, "max_concurrent": info.max_concurrent,
            "max_queued_tokens": info.max_queued_tokens, "admin": info.admin}


LIMIT_FLAGS = ("rpm", "tpm", "max_concurrent", "max_queued_tokens")


def _limit(value: str) -> int | None:
    """A limit flag's value: a whole number >= 1, or `none` to lift the limit."""
    if value.strip().lower() in ("none", "off", "0"):
        return None
    n = int(value)
    if n < 1:
        raise ValueError(value)
    return n


def _limits_text(info: Any) -> str:
    parts = [f"{name}={getattr(info, name)}" for name in LIMIT_FLAGS
             if getattr(info, name) is not None]
    return (" " + " ".join(parts) if parts else "") + (" admin" if info.admin else "")


def cmd_api(args: Any, settings: Settings) -> int:
    from inflight.api.server import serve

    logging.getLogger("alembic").setLevel(logging.WARNING)
    serve(settings, args.host, args.port, workers=args.workers, access_log=args.access_log)
    return 0


def cmd_keys_create(args: Any, settings: Settings) -> int:
    from inflight.api.keys import create_key

    with cli_io.store(settings) as store:
        new = create_key(store, args.name, owner=args.owner, admin=args.admin,
                         **{n: getattr(args, n) for n in LIMIT_FLAGS})
    cli_io.out(args, f"{new.token}\n(key {new.info.id}, owner {new.info.owner}: shown once, store "
               "it now; only its hash is kept)",
         {"key": new.token, **_key_dict(new.info)})
    return 0


def cmd_keys_list(args: Any, settings: Settings) -> int:
    from inflight.api.keys import all_keys

    with cli_io.store(settings) as store:
        keys = all_keys(store)
    lines = [f"{k.id}  {k.name:<24} owner={k.owner}  created={k.created_at:%Y-%m-%d %H:%M}"
             + _limits_text(k) + (f"  REVOKED {k.revoked_at:%Y-%m-%d %H:%M}" if k.revoked_at else "")
             for k in keys]
    cli_io.out(args, "\n".join(lines) or "no keys (create one: inflight keys create NAME)",
         [_key_dict(k) for k in keys])
    return 0


def cmd_keys_revoke(args: Any, settings: Settings) -> int:
    from inflight.api.keys import revoke

    with cli_io.store(settings) as store:
        info = revoke(store, args.id)
    if info is None:
        cli_io.out(args, f"{args.id}: not found", {"id": args.id, "status": "not_found"})
        return 1
    cli_io.out(args, f"{info.id} revoked (refused by running APIs within INFLIGHT_API_KEY_CACHE_S="
               f"{settings.api_key_cache_s:g}s)", _key_dict(info))
    return 0


def cmd_keys_update(args: Any, settings: Settings) -> int:
    from inflight.api.keys import update

    given = {n: getattr(args, n) for n in LIMIT_FLAGS if getattr(args, n) is not _UNSET}
    with cli_io.store(settings) as store:
        info = update(store, args.id, admin=args.admin, **given)
    if info is None:
        cli_io.out(args, f"{args.id}: not found", {"id": args.id, "status": "not_found"})
        return 1
    cli_io.out(args, f"{info.id} updated:{_limits_text(info) or ' no limits'} (running APIs "
               f"apply it within INFLIGHT_API_KEY_CACHE_S={settings.api_key_cache_s:g}s)",
               _key_dict(info))
    return 0


def cmd_usage(args: Any, settings: Settings) -> int:
    from datetime import date

    from inflight.store.limits import usage_by_day

    start = date.fromisoformat(args.since) if args.since else None
    end = date.fromisoformat(args.until) if args.until else None
    with cli_io.store(settings) as store:
        rows = usage_by_day(store, owner=args.owner, model=args.model, start=start, end=end,
                            by_tenant=args.by_tenant)
    who = "tenant" if args.by_tenant else "owner"
    lines = [f"{r['day']}  {str(r[who]):<24} {str(r['model']):<28} requests={r['requests']:<7} "
             f"prompt={r['prompt_tokens']:<10} output={r['completion_tokens']}" for r in rows]
    cli_io.out(args, "\n".join(lines) or "no usage recorded", {"data": rows})
    return 0


_UNSET = object()


def _add_limit_flags(p: Any, default: Any) -> None:
    p.add_argument("--rpm", type=_limit, default=default, metavar="N",
                   help="requests per minute (none: no limit)")
    p.add_argument("--tpm", type=_limit, default=default, metavar="N",
                   help="tokens per minute: prompt + max_tokens reserved, the real count once "
                        "done (none: no limit)")
    p.add_argument("--max-concurrent", dest="max_concurrent", type=_limit, default=default,
                   metavar="N", help="requests queued or running at once (none: no limit)")
    p.add_argument("--max-queued-tokens", dest="max_queued_tokens", type=_limit,
                   default=default, metavar="N",
                   help="tokens of the owner's batches not yet final; a batch over it fails "
                        "validation (none: no limit)")


def register(sub: Any) -> None:
    a = sub.add_parser("api", help="serve the HTTP API (FastAPI under uvicorn)")
    a.add_argument("--host", default="127.0.0.1")
    a.add_argument("--port", type=int, default=8000)
    a.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    a.add_argument("--access-log", action="store_true", help="log every request (off: counters "
                   "at /metrics and a summary line every INFLIGHT_METRICS_INTERVAL_S)")
    a.set_defaults(func=cmd_api, extra="api")

    k = sub.add_parser("keys", help="API keys of the HTTP API")
    k.set_defaults(extra="api")
    ksub = k.add_subparsers(dest="keys_cmd", required=True)
    kc = ksub.add_parser("create", help="create a key (printed once) named NAME")
    kc.add_argument("name")
    kc.add_argument("--owner", default=None, help="file its rows under this owner (default: "
                    "the key's own id; give a rotated key its predecessor's owner)")
    _add_limit_flags(kc, None)
    kc.add_argument("--admin", action="store_true", help="the key sees every owner's usage")
    kc.add_argument("--json", action="store_true")
    kc.set_defaults(func=cmd_keys_create)
    ku = ksub.add_parser("update", help="change a key's limits (docs/tenants.md)")
    ku.add_argument("id")
    _add_limit_flags(ku, _UNSET)
    ku.add_argument("--admin", default=None, type=lambda v: v.lower() in ("1", "true", "yes", "on"),
                    metavar="BOOL", help="the key sees every owner's usage")
    ku.add_argument("--json", action="store_true")
    ku.set_defaults(func=cmd_keys_update)
    kl = ksub.add_parser("list", help="list keys (never their secrets)")
    kl.add_argument("--json", action="store_true")
    kl.set_defaults(func=cmd_keys_list)
    kr = ksub.add_parser("revoke", help="revoke a key by id (key_...)")
    kr.add_argument("id")
    kr.add_argument("--json", action="store_true")
    kr.set_defaults(func=cmd_keys_revoke)

    u = sub.add_parser("usage", help="token usage by owner (or tenant), model and day, from "
                                     "the store")
    u.add_argument("--owner", default=None, help="only this owner's")
    u.add_argument("--model", default=None, help="only this model's")
    u.add_argument("--since", default=None, metavar="YYYY-MM-DD")
    u.add_argument("--until", default=None, metavar="YYYY-MM-DD", help="(inclusive)")
    u.add_argument("--by-tenant", action="store_true", help="group by tenant (Kafka producers "
                   "name their own), not by key owner")
    u.add_argument("--json", action="store_true")
    u.set_defaults(func=cmd_usage)


__all__ = ["register"]
