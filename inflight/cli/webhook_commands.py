"""`inflight webhooks add|list|rm|attempts`: batch-event webhook endpoints, straight on the
store (the HTTP API's /v1/webhooks does the same per key). Endpoints added here belong to
`--owner` (default: none, i.e. batches created without an API key, as the CLI and Client
create them); the jobs worker (`inflight jobs`) delivers (producers.webhooks)."""

from __future__ import annotations

from typing import Any

from inflight.cli import cli_io
from inflight.schemas import Settings


def cmd_add(args: Any, settings: Settings) -> int:
    from inflight.producers.webhooks import endpoint_object, register

    events = [e.strip() for e in args.events.split(",")] if args.events else None
    with cli_io.store(settings) as store:
        ep, secret = register(store, settings, url=args.url, events=events, owner=args.owner)
    cli_io.out(args, f"{ep.id}  {ep.url}  events={','.join(ep.events)}\nsecret: {secret}\n"
               "(shown once: give it to the receiver, which verifies each delivery with it)",
               endpoint_object(ep, secret))
    return 0


def cmd_list(args: Any, settings: Settings) -> int:
    from inflight.producers.webhooks import endpoint_object
    from inflight.store.webhooks import list_endpoints

    with cli_io.store(settings) as store:
        rows = list_endpoints(store, args.owner, every_owner=args.all)
    lines = [f"{e.id}  {e.status:<8} {e.url}  events={','.join(e.events)}"
             + (f"\n  {e.disabled_reason}" if e.disabled_reason else "") for e in rows]
    cli_io.out(args, "\n".join(lines) or "no webhook endpoints (add one: inflight webhooks add URL)",
               [endpoint_object(e) for e in rows])
    return 0


def cmd_rm(args: Any, settings: Settings) -> int:
    from inflight.store.webhooks import delete_endpoint

    with cli_io.store(settings) as store:
        gone = delete_endpoint(store, args.id)
    cli_io.out(args, f"{args.id}: {'removed' if gone else 'not found'}",
               {"id": args.id, "deleted": gone})
    return 0 if gone else 1


def cmd_attempts(args: Any, settings: Settings) -> int:
    from inflight.producers.webhooks import attempt_object
    from inflight.store.webhooks import list_attempts, require_endpoint

    with cli_io.store(settings) as store:
        require_endpoint(store, args.id)
        rows = list_attempts(store, args.id, limit=args.limit)
    lines = [f"{a.attempted_at:%Y-%m-%d %H:%M:%S}  {a.event_id}  #{a.attempt}  "
             f"{'ok' if a.ok else 'FAILED'}  {a.status_code or '-'}  {a.latency_ms} ms"
             + (f"  {a.error}" if a.error and not a.ok else "") for a in rows]
    cli_io.out(args, "\n".join(lines) or "no attempts yet", [attempt_object(a) for a in rows])
    return 0


def register(sub: Any) -> None:
    w = sub.add_parser("webhooks", help="signed webhooks of batch events (Standard Webhooks)")
    wsub = w.add_subparsers(dest="webhooks_cmd", required=True)
    a = wsub.add_parser("add", help="register an endpoint; prints its signing secret once")
    a.add_argument("url", help="https://... (plain http only to INFLIGHT_WEBHOOK_ALLOW_HOSTS)")
    a.add_argument("--events", default=None, help="comma-separated, e.g. batch.completed,"
                   "batch.failed (default: every batch event)")
    a.add_argument("--owner", default=None, help="the API key owner whose batches it follows")
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=cmd_add)
    ls = wsub.add_parser("list", help="endpoints, with why a disabled one was disabled")
    ls.add_argument("--owner", default=None)
    ls.add_argument("--all", action="store_true", help="every owner's")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_list)
    rm = wsub.add_parser("rm", help="remove an endpoint")
    rm.add_argument("id")
    rm.add_argument("--json", action="store_true")
    rm.set_defaults(func=cmd_rm)
    at = wsub.add_parser("attempts", help="an endpoint's delivery attempts, newest first")
    at.add_argument("id")
    at.add_argument("--limit", type=int, default=50)
    at.add_argument("--json", action="store_true")
    at.set_defaults(func=cmd_attempts)


__all__ = ["register"]
