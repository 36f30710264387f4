"""Webhooks of batch events on the real store (SQLite and Postgres) against a real HTTP
receiver on 127.0.0.1: every signature is verified with the official `openai` SDK's
`webhooks.unwrap` and with `standardwebhooks`; retries with backoff, attempts recorded, an
endpoint that keeps failing disabled with its reason; the URL rules. The Celery jobs
worker running the same `deliver` end to end: tests/api/test_webhooks.py."""

from __future__ import annotations

import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from inflight.producers import webhooks
from inflight.producers.webhook_rules import WebhookURLError, check_url, sign
from inflight.schemas import Settings
from inflight.store import CANCELLING, COMPLETED, FINALIZING, IN_PROGRESS, Store
from inflight.store import webhooks as q


class Receiver:
    """A local HTTP server answering each POST with the next code of `codes` (then 200),
    keeping (headers, body) of every request."""

    def __init__(self, codes: list[int] | None = None):
        self.codes = list(codes or [])
        self.got: list[tuple[dict[str, str], bytes]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                outer.got.append(({k.lower(): v for k, v in self.headers.items()}, body))
                code = outer.codes.pop(0) if outer.codes else 200
                self.send_response(code)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    made: list[Receiver] = []

    def make(codes=None) -> Receiver:
        made.append(Receiver(codes))
        return made[-1]
    yield make
    for r in made:
        r.close()


def settings(**kw) -> Settings:
    base = {"webhook_allow_hosts": "127.0.0.1", "webhook_retry_base_s": 0.05,
            "webhook_retry_max_s": 0.2, "webhook_timeout_s": 5.0}
    return Settings(**{**base, **kw})


def verify_both(secret: str, headers: dict[str, str], body: bytes) -> dict:
    """The event as the openai SDK and standardwebhooks verify it (each raises if not)."""
    import openai
    import standardwebhooks

    event = openai.OpenAI(api_key="unused", base_url="http://127.0.0.1:9").webhooks.unwrap(
        body.decode(), headers, secret=secret)
    payload = standardwebhooks.Webhook(secret).verify(body, headers)
    assert payload["id"] == event.id == headers["webhook-id"]
    return payload


def completed_batch(store: Store, owner: str) -> str:
    bid = f"batch_{uuid.uuid4().hex[:12]}"
    store.create_batch(bid, endpoint="/v1/chat/completions", input_file_id=None, owner=owner)
    for to in (IN_PROGRESS, FINALIZING, COMPLETED):
        assert store.transition_batch(bid, to)
    return bid


def deliver_until(store, s, done, timeout=30.0, **kw):
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "deliveries did not finish in time"
        webhooks.deliver(store, s, **kw)
        time.sleep(0.02)


def test_signed_event_verified_by_openai_sdk_and_standardwebhooks(db_url, receiver):
    store = Store(db_url, create=True)
    s, owner, rx = settings(), f"o-{uuid.uuid4().hex[:8]}", receiver()
    try:
        ep, secret = webhooks.register(store, s, url=rx.url, events=["batch.completed"],
                                       owner=owner)
        assert secret.startswith("whsec_") and ep.id.startswith("we_")
        other, _ = webhooks.register(store, s, url=rx.url, events=["batch.failed"], owner=owner)
        published: list[tuple[str, bytes]] = []
        bid = completed_batch(store, owner)
        deliver_until(store, s, lambda: len(rx.got) >= 1,
                      publish=lambda b, body: published.append((b, body)))
        headers, body = rx.got[0]
        event = verify_both(secret, headers, body)
        assert event == {"id": event["id"], "object": "event", "type": "batch.completed",
                         "created_at": event["created_at"], "data": {"id": bid}}
        assert event["id"].startswith("evt_")
        # the topic gets the same bytes (the shared database may hold other tests' events)
        assert [p for p in published if p[0] == bid] == [(bid, body)]
        webhooks.deliver(store, s)
        assert len(rx.got) == 1                       # delivered once; `other` wants failures
        [a] = q.list_attempts(store, ep.id)
        assert (a.ok, a.status_code, a.attempt) == (True, 200, 1)
        assert q.list_attempts(store, other.id) == []
        # a tampered body or another secret fails verification
        import standardwebhooks

        with pytest.raises(standardwebhooks.WebhookVerificationError):
            standardwebhooks.Webhook(secret).verify(body.replace(b"completed", b"failed"),
                                                    headers)
    finally:
        store.close()


def test_500_three_times_then_200_retries_with_the_same_event(db_url, receiver):
    store = Store(db_url, create=True)
    s, owner, rx = settings(), f"o-{uuid.uuid4().hex[:8]}", receiver([500, 500, 500])
    try:
        ep, secret = webhooks.register(store, s, url=rx.url, events=None, owner=owner)
        bid = completed_batch(store, owner)
        deliver_until(store, s, lambda: len(rx.got) >= 4)
        ids = {h["webhook-id"] for h, _ in rx.got}
        assert len(ids) == 1 and len(rx.got) == 4     # once more after each failure
        for headers, body in rx.got:
            assert verify_both(secret, headers, body)["data"] == {"id": bid}
        attempts = q.list_attempts(store, ep.id)      # newest first
        assert [(a.attempt, a.ok, a.status_code) for a in attempts] == [
            (4, True, 200), (3, False, 500), (2, False, 500), (1, False, 500)]
        gaps = [(attempts[i].attempted_at - attempts[i + 1].attempted_at).total_seconds()
                for i in range(3)]
        assert gaps[0] >= 0.15 and gaps[2] >= 0.04   # backoff: 0.05, 0.1, 0.2 (capped)
        assert q.get_endpoint(store, ep.id).status == "enabled"
        assert q.get_endpoint(store, ep.id).failures == 0
    finally:
        store.close()


def test_endpoint_that_keeps_failing_is_disabled_with_a_reason(db_url, receiver):
    store = Store(db_url, create=True)
    s = settings(webhook_disable_after=3, webhook_max_attempts=10)
    owner, rx = f"o-{uuid.uuid4().hex[:8]}", receiver([503] * 50)
    try:
        ep, _ = webhooks.register(store, s, url=rx.url, events=None, owner=owner)
        completed_batch(store, owner)
        deliver_until(store, s, lambda: q.get_endpoint(store, ep.id).status == "disabled")
        row = q.get_endpoint(store, ep.id)
        assert "3 failed delivery attempts in a row" in row.disabled_reason
        assert "HTTP 503" in row.disabled_reason
        assert len(rx.got) == 3
        completed_batch(store, owner)                  # a disabled endpoint gets nothing more
        for _ in range(3):
            webhooks.deliver(store, s)
        assert len(rx.got) == 3
        assert webhooks.endpoint_object(row)["disabled_reason"] == row.disabled_reason
    finally:
        store.close()


def test_one_event_per_final_move_written_with_it(db_url):
    store = Store(db_url, create=True)
    owner = f"o-{uuid.uuid4().hex[:8]}"
    try:
        bid = f"batch_{uuid.uuid4().hex[:12]}"
        store.create_batch(bid, endpoint="/v1/completions", input_file_id=None, owner=owner)
        assert store.transition_batch(bid, CANCELLING)
        assert q.batch_events(store, bid) == []        # cancelling is not an event
        assert store.transition_batch(bid, "cancelled")
        assert not store.transition_batch(bid, "cancelled")
        assert [e.type for e in q.batch_events(store, bid)] == ["batch.cancelled"]
    finally:
        store.close()


@pytest.mark.parametrize("url, allowed", [
    ("https://example.com/hook", True),
    ("http://example.com/hook", False),                        # plain http: not allow-listed
    ("http://127.0.0.1:8080/hook", True),                      # on the allow list
    ("https://169.254.169.254/latest/meta-data", False),       # cloud metadata (link-local)
    ("https://169.254.10.1/x", False),                         # link-local v4
    ("https://[fe80::1]/x", False),                            # link-local v6
    ("https://[fd00:ec2::254]/x", False),                      # AWS IMDS over IPv6
    ("https://[::ffff:169.254.169.254]/x", False),             # v4-mapped metadata
    ("https://100.100.100.200/x", False),                      # Alibaba Cloud metadata
    ("https://metadata.google.internal/computeMetadata/v1/", False),
    ("https://user:pw@example.com/x", False),
    ("ftp://example.com/x", False),
    ("https:///nohost", False),
])
def test_url_rules(url, allowed):
    if allowed:
        assert check_url(url, frozenset({"127.0.0.1"})) == url
    else:
        with pytest.raises(WebhookURLError) as info:
            check_url(url, frozenset({"127.0.0.1"}))
        assert info.value.field == "url"


def test_signature_matches_the_standard_webhooks_reference():
    import standardwebhooks

    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = b'{"id":"evt_1","object":"event"}'
    sig = sign(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body)
    headers = {"webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek",
               "webhook-timestamp": "1614265330", "webhook-signature": sig}
    wh = standardwebhooks.Webhook(secret)
    assert sig == wh.sign("msg_p5jXN8AQM9LWM0D4loKWxJek",
                          __import__("datetime").datetime.fromtimestamp(
                              1614265330, __import__("datetime").timezone.utc), body.decode())


def test_a_failed_publish_keeps_the_event_for_the_next_pass(db_url, receiver):
    store = Store(db_url, create=True)
    s, owner, rx = settings(), f"o-{uuid.uuid4().hex[:8]}", receiver()
    try:
        webhooks.register(store, s, url=rx.url, events=None, owner=owner)
        bid = completed_batch(store, owner)

        def down(b, body):
            raise OSError("broker away")
        report = webhooks.deliver(store, s, publish=down)
        assert report.publish_failed >= 1 and rx.got == []
        sent: list[str] = []
        deliver_until(store, s, lambda: len(rx.got) >= 1, publish=lambda b, body: sent.append(b))
        assert bid in sent and orjson_id(rx.got[0][1]) == bid
    finally:
        store.close()


def orjson_id(body: bytes) -> str:
    import orjson

    return orjson.loads(body)["data"]["id"]
