"""`inflight api` (serve the HTTP API) and `inflight keys create NAME / list / revoke ID`."""

from __future__ import annotations

import logging
from typing import Any

from inflight.cli import cli_io
from inflight.schemas import Settings


def _key_dict(info: Any) -> dict[str, Any]:
    return {"id": info.id, "name": info.name, "owner": info.owner,
            "created_at": info.created_at.isoformat(),
            "revoked_at": info.revoked_at.isoformat() if info.revoked_at else None}


def cmd_api(args: Any, settings: Settings) -> int:
    from inflight.api.server import serve

    logging.getLogger("alembic").setLevel(logging.WARNING)
    serve(settings, args.host, args.port, workers=args.workers, access_log=args.access_log)
    return 0


def cmd_keys_create(args: Any, settings: Settings) -> int:
    from inflight.api.keys import create_key

    with cli_io.store(settings) as store:
        new = create_key(store, args.name, owner=args.owner)
    cli_io.out(args, f"{new.token}\n(key {new.info.id}, owner {new.info.owner}: shown once, store "
               "it now; only its hash is kept)",
         {"key": new.token, **_key_dict(new.info)})
    return 0


def cmd_keys_list(args: Any, settings: Settings) -> int:
    from inflight.api.keys import all_keys

    with cli_io.store(settings) as store:
        keys = all_keys(store)
    lines = [f"{k.id}  {k.name:<24} owner={k.owner}  created={k.created_at:%Y-%m-%d %H:%M}"
             + (f"  REVOKED {k.revoked_at:%Y-%m-%d %H:%M}" if k.revoked_at else "")
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
    kc.add_argument("--json", action="store_true")
    kc.set_defaults(func=cmd_keys_create)
    kl = ksub.add_parser("list", help="list keys (never their secrets)")
    kl.add_argument("--json", action="store_true")
    kl.set_defaults(func=cmd_keys_list)
    kr = ksub.add_parser("revoke", help="revoke a key by id (key_...)")
    kr.add_argument("id")
    kr.add_argument("--json", action="store_true")
    kr.set_defaults(func=cmd_keys_revoke)


__all__ = ["register"]
