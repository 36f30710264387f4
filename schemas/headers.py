"""Kafka record headers: what every message the project produces carries, and how a request's
headers travel onto every event of that request (docs/kafka-contract.md, "Headers").

    content-type          application/json                         every message we write
    schema-version        "1" (the body's schema_version)           every message we write
    inflight-request-id   the request id                            requests and their events
    inflight-tenant       the request's tenant, when it names one   requests and their events
    traceparent           W3C trace context (00-<trace>-<span>-<flags>), when the request
    tracestate            carried one (the Client and the API start one when none is given)

A request's events (status, token deltas, final, error, reply_to copies) carry the request's
headers: ours above set from the event, every other header -- traceparent,
tracestate, and any header of a foreign producer -- copied unchanged, in order. A header
that is not ours is never read as one of ours (a foreign `inflight-tenant` is copied, not
taken for the tenant; a malformed traceparent is copied, and no trace id is read from it).
"""

from __future__ import annotations

import os
import re
from typing import Any

from inflight.schemas.base import SCHEMA_VERSION

CONTENT_TYPE = "content-type"
SCHEMA_VERSION_HEADER = "schema-version"
REQUEST_ID = "inflight-request-id"
TENANT = "inflight-tenant"
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
JSON = b"application/json"
VERSION = str(SCHEMA_VERSION).encode()

# set from the event on every event of a request (inflight-tenant only when the request
# names a tenant: else a producer's header of that name is copied like any other)
OURS = frozenset({CONTENT_TYPE, SCHEMA_VERSION_HEADER, REQUEST_ID})

Headers = list[tuple[str, bytes]]

# W3C trace context, version 00: 32 hex trace id (not all zeros), 16 hex span id, 2 hex flags
TRACEPARENT_RE = re.compile(rb"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


def message_headers(request_id: str | None = None, tenant: str | None = None) -> Headers:
    """content-type and schema-version, plus the request id and tenant when given."""
    out: Headers = [(CONTENT_TYPE, JSON), (SCHEMA_VERSION_HEADER, VERSION)]
    if request_id is not None:
        out.append((REQUEST_ID, request_id.encode()))
    if tenant is not None:
        out.append((TENANT, tenant.encode()))
    return out


def header_value(value: Any) -> bytes:
    """A header value as bytes: None (a null header) is b"", text is UTF-8."""
    if value is None:
        return b""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    return str(value).encode("utf-8", "backslashreplace")


def header_key(key: Any) -> str:
    """A header key as sendable text (kafka-python hands over non-UTF-8 keys escaped)."""
    if isinstance(key, (bytes, bytearray, memoryview)):
        key = bytes(key).decode("utf-8", "backslashreplace")
    elif not isinstance(key, str):
        key = str(key)
    return key.encode("utf-8", "backslashreplace").decode("utf-8")


def event_headers(request_headers: list | None, request_id: str | None,
                  tenant: str | None = None) -> Headers:
    """The headers of every event of a request: ours from the event, the request's other
    headers (trace context, foreign ones) copied unchanged, in order (the module doc)."""
    out = message_headers(request_id, tenant)
    for key, value in request_headers or ():
        key = header_key(key)
        if key in OURS or (key == TENANT and tenant is not None):
            continue
        out.append((key, header_value(value)))
    return out


def get_header(headers: list | None, name: str) -> bytes | None:
    """The value of the first header named `name` (None: absent)."""
    for key, value in headers or ():
        if (key.decode("utf-8", "replace") if isinstance(key, bytes) else key) == name:
            return header_value(value)
    return None


def trace_id(headers: list | None) -> str | None:
    """The trace id of a well-formed W3C traceparent header (32 hex digits), else None."""
    value = get_header(headers, TRACEPARENT)
    if not value:
        return None
    m = TRACEPARENT_RE.match(value.strip().lower())
    if m is None or m.group(1) == b"0" * 32 or m.group(2) == b"0" * 16:
        return None
    return m.group(1).decode()


def new_traceparent(sampled: bool = True) -> bytes:
    """A fresh W3C traceparent: a random trace id and span id (a root with no tracer)."""
    return b"00-%s-%s-%s" % (os.urandom(16).hex().encode(), os.urandom(8).hex().encode(),
                             b"01" if sampled else b"00")
