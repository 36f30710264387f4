"""The route class of every API router: the caller is known before the body is read, and a
JSON body is read by the one parser (schemas.json_text).

    request ─► route matched ─► key checked from the headers (401: nothing read)
                                 ─► a compressed body (Content-Encoding): 415
                                 ─► JSON body parsed: 400 with a `code` (json_invalid,
                                    json_too_deep, invalid_utf8, lone_surrogate) and the
                                    field holding a bad string
                                 ─► FastAPI: validation, dependencies, the handler

NOTE: FastAPI reads and parses a body before it resolves dependencies, so a key checked
only by a dependency would come after an upload of up to INFLIGHT_API_MAX_UPLOAD_BYTES.
Here the principal is put on `request.state` first; `api.deps.principal` hands it on.
A body that parses as JSON is taken whatever its content type says (curl's `-d` says
application/x-www-form-urlencoded); multipart bodies (uploads) are left to FastAPI.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import params
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

from inflight.api.deps import authenticate, principal
from inflight.api.errors import APIError
from inflight.api.rate_limits import open_window
from inflight.schemas.errors import SchemaError
from inflight.schemas.json_text import parse_json

JSON_TYPE = (b"content-type", b"application/json")


def _uses(dependant: Dependant, call: Callable[..., Any]) -> bool:
    return any(d.call is call or _uses(d, call) for d in dependant.dependencies)


class ApiRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        needs_key = _uses(self.dependant, principal)
        json_body = (self.body_field is not None
                     and not isinstance(self.body_field.field_info, params.Form))

        async def run(request: Request) -> Response:
            rate = None
            if needs_key:
                request.state.principal = principal_ = await authenticate(request)
                rate = await open_window(request, principal_)
            if rate is None:
                return await _handle(request)
            try:
                response = await _handle(request)
            except APIError as exc:  # 429s carry the headers already
                exc.headers = rate.headers() | (exc.headers or {})
                raise
            response.headers.update(rate.headers())
            return response

        async def _handle(request: Request) -> Response:
            encoding = request.headers.get("content-encoding", "identity").strip().lower()
            if encoding not in ("", "identity"):
                # NOTE: read as it is, a gzip body is "not UTF-8"; unpacked, it could be a bomb
                raise APIError(415, f"Content-Encoding {encoding!r:.40} is not supported; send "
                                    "the body uncompressed", param="content-encoding",
                               code="unsupported_content_encoding")
            if json_body:
                await read_json(request)
            return await handler(request)

        return run


async def read_json(request: Request) -> Any:
    """The request's JSON body (None when it has none), parsed once and kept where FastAPI
    looks for it; APIError 400 when it is not JSON a client may send."""
    body = await request.body()
    if not body:
        return None
    ctype = request.headers.get("content-type", "")
    if ctype.startswith("multipart/"):
        return None
    try:
        value = parse_json(body, what="the request body")
    except SchemaError as exc:
        raise APIError(400, exc.message, param=exc.field, code=exc.code) from None
    request._json = value  # Starlette's cache of request.json(), which FastAPI reads
    if not ctype.startswith("application/json"):
        request.scope["headers"] = [h for h in request.scope["headers"]
                                    if h[0] != b"content-type"] + [JSON_TYPE]
        request.__dict__.pop("_headers", None)
    return value
