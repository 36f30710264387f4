"""Batch events out: signed webhooks and the batch-events topic (the jobs worker's delivery
task runs `deliver`, every INFLIGHT_WEBHOOK_INTERVAL_S; never an API request).

    batch_events (outbox rows, written by the UPDATE that ended the batch)
      └─ fan out ─► topic INFLIGHT_TOPIC_BATCH_EVENTS (key = batch id, value = the event)
                └─► one delivery per enabled endpoint of the batch's owner wanting the type
    due deliveries ─► claim ─► POST (signed) ─► attempt row ─► delivered | retry | given up

The event is OpenAI's shape: `{"id": "evt_...", "object": "event", "type":
"batch.completed", "created_at": <epoch s>, "data": {"id": "<batch id>"}}`, the same bytes
on every attempt and on the topic. Retries back off exponentially (INFLIGHT_WEBHOOK_RETRY_
BASE_S doubling up to _RETRY_MAX_S) for at most INFLIGHT_WEBHOOK_MAX_ATTEMPTS attempts;
INFLIGHT_WEBHOOK_DISABLE_AFTER failed attempts in a row disable the endpoint, with the
reason. Delivery is at-least-once: a worker killed between the POST and its record sends
it again, with the same `webhook-id`.

Endpoints (`POST /v1/webhooks`, `inflight webhooks add`): `register` checks the URL
(producers.webhook_rules) and the event types and returns the secret once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import orjson

from inflight.schemas import Settings
from inflight.schemas.errors import SchemaError
from inflight.store import Store
from inflight.store import webhooks as q
from inflight.store.webhook_models import ENABLED, BatchEventRow, WebhookEndpointRow

from inflight.producers.webhook_rules import check_url, new_secret, resolve_allowed, sign

log = logging.getLogger("inflight.webhooks")

EVENT_TYPES = ("batch.completed", "batch.failed", "batch.expired", "batch.cancelled")
MAX_ERROR = 500


def register(store: Store, settings: Settings, *, url: str, events: list[str] | None,
             owner: str | None) -> tuple[WebhookEndpointRow, str]:
    """A new endpoint and its secret (shown once). `events` None: every batch event."""
    check_url(url, settings.webhook_allowed_hosts())
    events = list(EVENT_TYPES) if events is None else events
    bad = [e for e in events if e not in EVENT_TYPES]
    if not events or bad or len(set(events)) != len(events):
        raise SchemaError(f"events: {bad or events!r} is not a list of distinct event types "
                          f"from {list(EVENT_TYPES)}", field="events")
    secret = new_secret()
    return q.create_endpoint(store, url=url, events=events, secret=secret, owner=owner), secret


def endpoint_object(ep: WebhookEndpointRow, secret: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": ep.id, "object": "webhook_endpoint", "url": ep.url, "events": list(ep.events),
        "status": ep.status, "disabled_reason": ep.disabled_reason,
        "created_at": int(ep.created_at.timestamp())}
    if secret is not None:
        out["secret"] = secret
    return out


def attempt_object(a: Any) -> dict[str, Any]:
    return {"object": "webhook_attempt", "event_id": a.event_id, "attempt": a.attempt,
            "attempted_at": int(a.attempted_at.timestamp()), "ok": a.ok,
            "status_code": a.status_code, "latency_ms": a.latency_ms, "error": a.error}


def event_body(ev: BatchEventRow) -> bytes:
    """The event's JSON, identical on every attempt and on the topic."""
    return orjson.dumps({"id": ev.id, "object": "event", "type": ev.type,
                         "created_at": int(ev.created_at.timestamp()),
                         "data": {"id": ev.batch_id}})


@dataclass
class DeliveryReport:
    fanned_out: int = 0
    published: int = 0
    publish_failed: int = 0
    delivered: int = 0
    retried: int = 0
    given_up: int = 0
    disabled: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


Publish = Callable[[str, bytes], None]   # (batch id, event body) -> on the topic, acknowledged


def deliver(store: Store, settings: Settings, *, publish: Publish | None = None,
            http: Any = None, limit: int = 100) -> DeliveryReport:
    """One pass: fan out new events (and publish them), then make every due attempt. One
    endpoint's failure never stops the others (each attempt is recorded)."""
    report = DeliveryReport()
    for ev in q.unfanned_events(store):
        if not q.claim_event(store, ev, settings.webhook_timeout_s * 2 + 5):
            continue  # another delivery task has it
        published = False
        if publish is not None:
            try:
                publish(ev.batch_id, event_body(ev))
            except Exception as exc:  # noqa: BLE001 - the broker away: the next pass retries
                log.warning("batch event %s: publishing to the batch-events topic failed (%s); "
                            "the next pass sends it (its webhooks wait for it)", ev.id, exc)
                q.release_event(store, ev)
                report.publish_failed += 1
                continue
            published = True
            report.published += 1
        report.fanned_out += q.fan_out(store, ev, published)
    due = q.due_deliveries(store, limit)
    if not due:
        return report
    own_client = http is None
    if own_client:
        import httpx

        http = httpx.Client(timeout=settings.webhook_timeout_s, follow_redirects=False,
                            trust_env=False)
    try:
        for d in due:
            if not q.claim_delivery(store, d, settings.webhook_timeout_s * 2 + 5):
                continue
            _attempt(store, settings, http, d, report)
    finally:
        if own_client:
            http.close()
    return report


def _attempt(store: Store, settings: Settings, http: Any, d: Any, report: DeliveryReport) -> None:
    ep, ev = q.get_endpoint(store, d.endpoint_id), q.get_event(store, d.event_id)
    if ep is None or ev is None or ep.status != ENABLED:
        q.give_up(store, d)  # the endpoint was disabled or removed meanwhile
        return
    body = event_body(ev)
    parts = urlsplit(ep.url)
    why = resolve_allowed(parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80))
    status: int | None = None
    error: str | None = None
    t0 = time.monotonic()
    if why is None:
        ts = int(time.time())
        headers = {"content-type": "application/json", "user-agent": "inflight-webhooks",
                   "webhook-id": ev.id, "webhook-timestamp": str(ts),
                   "webhook-signature": sign(ep.secret, ev.id, ts, body)}
        try:
            status = http.post(ep.url, content=body, headers=headers).status_code
        except Exception as exc:  # noqa: BLE001 - any failure of one POST is that attempt's
            error = f"{type(exc).__name__}: {exc}"[:MAX_ERROR]
    else:
        error = f"refused: {why}"
    latency = int((time.monotonic() - t0) * 1000)
    ok = status is not None and 200 <= status < 300
    attempt = d.attempts + 1
    retry_in = None
    if not ok and attempt < settings.webhook_max_attempts:
        retry_in = min(settings.webhook_retry_base_s * 2 ** (attempt - 1),
                       settings.webhook_retry_max_s)
    if not ok and error is None:
        error = f"HTTP {status}"
    reason = q.record_attempt(store, d, ok=ok, status_code=status, latency_ms=latency,
                              error=None if ok else error, retry_in_s=retry_in,
                              disable_after=settings.webhook_disable_after)
    if ok:
        report.delivered += 1
    elif retry_in is not None:
        report.retried += 1
    else:
        report.given_up += 1
        log.warning("webhook %s: event %s given up after %d attempts (%s)", ep.id, ev.id,
                    attempt, error)
    if reason:
        report.disabled.append(ep.id)
        log.warning("webhook %s (%s): %s", ep.id, ep.url, reason)
