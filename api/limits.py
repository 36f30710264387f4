"""Caps on request bodies, enforced before a handler reads them.

Uploads (`POST /v1/files`) and Anthropic message-batch bodies (which carry every request
inline) may be `INFLIGHT_API_MAX_UPLOAD_BYTES` (200 MB); every other body is capped at
`INFLIGHT_API_MAX_BODY_BYTES`. A declared Content-Length over the cap is refused at once
(413) without reading the body; a chunked body is counted as it arrives and refused the
moment it passes the cap.
"""

from __future__ import annotations

import orjson
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inflight.api.errors import error_body

UPLOAD_PATHS = ("/v1/files", "/v1/messages/batches")


class BodyTooLarge(HTTPException):
    """An HTTPException, so body parsers pass it through unchanged (they turn other
    errors into a generic 400); api.errors answers it as a 413 in the client's shape."""

    def __init__(self, limit: int, setting: str):
        super().__init__(413, f"the request body is over the limit of {limit:,} bytes "
                              f"(server setting {setting}); send less")


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, *, body_bytes: int, upload_bytes: int):
        self.app = app
        self.body_bytes = body_bytes
        self.upload_bytes = upload_bytes

    def _cap(self, path: str) -> tuple[int, str]:
        if path.rstrip("/") in UPLOAD_PATHS:
            return self.upload_bytes, "INFLIGHT_API_MAX_UPLOAD_BYTES"
        return self.body_bytes, "INFLIGHT_API_MAX_BODY_BYTES"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, setting = self._cap(scope["path"])
        declared = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                break
        if declared is not None and (declared < 0 or declared > limit):
            status, message = ((413, BodyTooLarge(limit, setting).detail) if declared > limit
                               else (400, "Content-Length is not a number"))
            body = orjson.dumps(error_body(scope["path"], status, message, None,
                                           "request_too_large" if status == 413 else None))
            await send({"type": "http.response.start", "status": status,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode()),
                                    (b"connection", b"close")]})
            await send({"type": "http.response.body", "body": body})
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit, setting)  # inside the app: answered as a 413
            return message

        await self.app(scope, counted if declared is None else receive, send)
