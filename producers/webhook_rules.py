"""Webhook endpoints: which URLs may be registered, their secrets, and the signature.

URL rules (checked when an endpoint is registered, and again on every delivery against the
addresses its host resolves to, so a name that later points elsewhere is still refused):

- `https://...` anywhere; plain `http://` only to a host on INFLIGHT_WEBHOOK_ALLOW_HOSTS
  (empty by default);
- never an address in link-local space (169.254.0.0/16, fe80::/10: where clouds serve
  instance metadata and credentials), nor a cloud metadata address or name:
  METADATA_ADDRESSES (AWS IMDS over IPv6 fd00:ec2::254, Alibaba Cloud 100.100.100.200,
  Oracle Cloud 192.0.0.192, and 169.254.169.254 which the link-local rule covers) and
  METADATA_HOSTS (metadata.google.internal, metadata, metadata.azure.internal ...);
- no user:password in the URL, no fragment.

Signature (Standard Webhooks, as the `openai` SDK's `webhooks.unwrap` and the
`standardwebhooks` package verify): headers `webhook-id` (the event id), `webhook-timestamp`
(epoch seconds) and `webhook-signature: v1,<base64 HMAC-SHA256(key, f"{id}.{ts}.{body}")>`,
where the key is the base64 part of the endpoint's secret `whsec_<base64>`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import secrets
import socket
from urllib.parse import urlsplit

from inflight.schemas.errors import SchemaError

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32
METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254", "fd00:ec2::254", "100.100.100.200", "192.0.0.192", "169.254.170.2"))
METADATA_HOSTS = frozenset({"metadata", "metadata.google.internal", "metadata.goog",
                            "metadata.azure.internal", "instance-data",
                            "instance-data.ec2.internal"})
LINK_LOCAL = (ipaddress.ip_network("169.254.0.0/16"), ipaddress.ip_network("fe80::/10"))
MAX_URL = 2048


class WebhookURLError(SchemaError):
    """A webhook URL that may not be registered or called (the message says which rule)."""


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def sign(secret: str, event_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` header value for one delivery."""
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    mac = hmac.new(key, f"{event_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def blocked_address(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Why `addr` may never receive a webhook, or None."""
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    if addr in METADATA_ADDRESSES:
        return f"{addr} is a cloud metadata address"
    if any(addr in net for net in LINK_LOCAL):
        return f"{addr} is link-local ({'169.254.0.0/16' if addr.version == 4 else 'fe80::/10'})"
    return None


def check_url(url: str, allow_hosts: frozenset[str]) -> str:
    """The URL as registered, or WebhookURLError naming the rule it breaks."""
    if not isinstance(url, str) or not url or len(url) > MAX_URL:
        raise WebhookURLError(f"url: give an https:// URL of at most {MAX_URL} characters",
                              field="url")
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError as exc:
        raise WebhookURLError(f"url: {exc}", field="url") from None
    if parts.scheme not in ("https", "http") or not host:
        raise WebhookURLError(f"url: {url!r:.200} is not an http(s) URL with a host; give "
                              "https://host/path", field="url")
    if parts.username is not None or parts.password is not None or parts.fragment:
        raise WebhookURLError("url: no user:password@ or #fragment in a webhook URL",
                              field="url")
    if parts.scheme == "http" and host not in allow_hosts:
        raise WebhookURLError(
            f"url: plain http to {host} is refused; use https, or add the host to "
            "INFLIGHT_WEBHOOK_ALLOW_HOSTS (comma-separated; empty by default)", field="url")
    why = blocked_host(host)
    if why:
        raise WebhookURLError(f"url: {why}; webhooks are never sent there", field="url")
    return url


def blocked_host(host: str) -> str | None:
    """Why a literal host may never receive a webhook (a name is checked by what it
    resolves to at delivery: resolve_allowed)."""
    host = host.lower().rstrip(".")
    if host in METADATA_HOSTS:
        return f"{host} is a cloud metadata host name"
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return None
    return blocked_address(addr)


def resolve_allowed(host: str, port: int) -> str | None:
    """At delivery: why the host's resolved addresses are refused, or None."""
    why = blocked_host(host)
    if why:
        return why
    try:
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except OSError as exc:
        return f"cannot resolve {host}: {exc}"
    for info in infos:
        why = blocked_address(ipaddress.ip_address(info[4][0].split("%")[0]))
        if why:
            return f"{host} resolves to {why}"
    return None
