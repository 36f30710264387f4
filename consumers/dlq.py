"""The copy of a bad message that goes to the DLQ topic: its bytes and headers, plus why.

Whatever a producer put on the requests topic must be forwardable: header values that are
null, header keys that are not UTF-8 (kafka-python hands them over escaped), bodies larger
than Kafka takes back. kafka-python's producer refuses all three (TypeError, or
MessageSizeTooLargeError forever), which would stall the worker on one poison pill.
"""

from __future__ import annotations

from inflight.schemas.headers import header_key as _header_key
from inflight.schemas.headers import header_value as _header_value

TRUNCATED_BODY_BYTES = 64 * 1024   # what is kept of a body too large to forward whole
HEADER_VALUE_BYTES = 4000          # error texts in headers are cut to this
_OURS = ("inflight-error-code", "inflight-error", "inflight-source")


def dlq_headers(headers: list | None, code: str, message: str, source: str) -> list[tuple[str, bytes]]:
    """The original headers, made sendable, plus inflight-error-code / -error / -source."""
    out = [(_header_key(k), _header_value(v)) for k, v in (headers or [])]
    out += [("inflight-error-code", code.encode()),
            ("inflight-error", message.encode("utf-8", "backslashreplace")[:HEADER_VALUE_BYTES]),
            ("inflight-source", source.encode("utf-8", "backslashreplace"))]
    return out


def dlq_value(raw: bytes, headers: list[tuple[str, bytes]], max_bytes: int, *,
              bare: bool = False) -> tuple[bytes, list[tuple[str, bytes]]]:
    """The body to forward and its headers. A body over `max_bytes` (minus room for the
    headers) keeps its first TRUNCATED_BODY_BYTES; `bare` (Kafka refused even that) keeps
    no body and only our own headers. Either way `inflight-original-bytes` says how big
    the original was."""
    original = _original_size(raw, headers)
    if bare:
        ours = [h for h in headers if h[0] in _OURS]
        return b"", ours + [("inflight-truncated", b"body and headers dropped"),
                                ("inflight-original-bytes", str(original).encode())]
    header_bytes = sum(len(k) + len(v) for k, v in headers)
    if len(raw) + header_bytes <= max_bytes:
        return raw, headers
    return raw[:TRUNCATED_BODY_BYTES], headers + [
        ("inflight-truncated", f"body cut to {TRUNCATED_BODY_BYTES} bytes".encode()),
        ("inflight-original-bytes", str(original).encode())]


def _original_size(raw: bytes, headers: list[tuple[str, bytes]]) -> int:
    for k, v in headers:
        if k == "inflight-original-bytes":
            return int(v)
    return len(raw)
