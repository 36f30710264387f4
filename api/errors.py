"""Errors as clients expect them, and never a stack trace.

OpenAI shape (every route but Anthropic's):

    {"error": {"message": "...", "type": "invalid_request_error", "param": "messages", "code": null}}

Anthropic shape (routes under /v1/messages):

    {"type": "error", "error": {"type": "not_found_error", "message": "..."}}

Everything that leaves a handler goes through `install(app)`: our `APIError`, the project's
`InflightError` tree (SchemaError -> 400, NotFoundError -> 404, StateError -> 409,
BrokerError/StoreError -> 503 when the broker or database is away; a database refusing
data -> 500), FastAPI's body
validation (-> 400 naming the field), Starlette's 404/405, and any other exception (-> 500
with an error id that is also in the server log with the traceback).
"""

from __future__ import annotations

import logging
import re
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from inflight.api.responses import json_response
from inflight.schemas.errors import (BrokerError, InflightError, NotFoundError, SchemaError, StateError,
                           StoreError)
from inflight.store.queries import is_transient

log = logging.getLogger("inflight.api")

ANTHROPIC_PREFIX = "/v1/messages"

# status -> OpenAI error type (OpenAI answers most 4xx with invalid_request_error)
_OPENAI_TYPES = {401: "invalid_request_error", 403: "permission_error",
                 429: "rate_limit_error", 500: "server_error", 503: "server_error",
                 504: "timeout_error"}
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                    403: "permission_error", 404: "not_found_error", 409: "invalid_request_error",
                    413: "request_too_large", 422: "invalid_request_error",
                    429: "rate_limit_error", 500: "api_error", 503: "overloaded_error",
                    504: "api_error"}


class APIError(Exception):
    """An error answered to the client: HTTP status, a message that says what to fix, and
    optionally the offending parameter and a machine-readable code."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers


def not_found(what: str, ident: str) -> APIError:
    """404 for an unknown id, and for another key's id (the same answer: no existence leak)."""
    return APIError(404, f"No {what} found with id {ident!r}.", code="not_found")


def error_body(path: str, status: int, message: str, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    if path.startswith(ANTHROPIC_PREFIX):
        return {"type": "error",
                "error": {"type": _ANTHROPIC_TYPES.get(status, "invalid_request_error"
                                                       if status < 500 else "api_error"),
                          "message": message}}
    return {"error": {"message": message,
                      "type": _OPENAI_TYPES.get(status, "invalid_request_error"
                                                if status < 500 else "server_error"),
                      "param": param, "code": code}}


def error_response(request: Request, status: int, message: str, *, param: str | None = None,
                   code: str | None = None, headers: dict[str, str] | None = None) -> Response:
    return json_response(error_body(request.url.path, status, message, param, code), status,
                         headers)


# the names pydantic gives a union's members in an error's path (`content.str`,
# `prompt.constrained-str`, `stop.list[constrained-str]`): not fields a client wrote
_UNION_MEMBER = re.compile(r"^(str|int|float|bool|list|dict|constrained-[\w-]+|[\w-]+\[.*\])$")


# a message's role is the tag of a discriminated union: pydantic puts it after the list
# index (`messages.0.user.content`), where the client wrote `messages.0.content`
_ROLE_TAGS = frozenset({"system", "developer", "user", "assistant", "tool"})


def _loc(loc: tuple[Any, ...]) -> str | None:
    parts: list[str] = []
    prev: Any = None
    for p in loc:
        skip = (p in ("body", "query", "path", "header")
                or (isinstance(p, str) and _UNION_MEMBER.match(p))
                or (isinstance(prev, int) and p in _ROLE_TAGS))
        if not skip:
            parts.append(str(p))
        prev = p
    return ".".join(parts) if parts else None  # (a key may be "")


def validation_code(exc: RequestValidationError) -> str:
    """The first error's own code when it has one (a schema the grammar engine refuses:
    invalid_schema), else invalid_request."""
    errors = exc.errors()
    cause = (errors[0].get("ctx") or {}).get("error") if errors else None
    code = getattr(cause, "code", None)
    return code if isinstance(code, str) else "invalid_request"


def validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    param = _loc(tuple(first.get("loc", ())))
    msg = first.get("msg", "invalid value")
    if first.get("type") == "missing":
        text = f"missing required parameter {param!r}" if param else "missing request body"
    elif first.get("type") in ("extra_forbidden", "unexpected_keyword_argument"):
        text = f"unknown parameter {param!r}: remove it"
    elif first.get("type") == "json_invalid":
        text = f"the request body is not valid JSON ({(first.get('ctx') or {}).get('error', msg)})"
        param = None
    elif first.get("type") in ("model_attributes_type", "dict_type") and not param:
        text = ("the request body must be a JSON object (and the request must say "
                "Content-Type: application/json)")
    else:
        msg = msg.removeprefix("Value error, ")
        text = f"{param}: {msg}" if param else msg
    if len(errors) > 1:
        text += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return text, param


def install(app: FastAPI) -> None:
    """Register the handlers that turn every failure into the client's error shape."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> Response:
        return error_response(request, exc.status, exc.message, param=exc.param, code=exc.code,
                              headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> Response:
        text, param = validation_message(exc)
        return error_response(request, 400, text, param=param, code=validation_code(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 404:
            text = f"unknown URL {request.method} {request.url.path}"
        elif exc.status_code == 405:
            text = f"method {request.method} is not allowed on {request.url.path}"
        else:
            text = str(exc.detail)
        return error_response(request, exc.status_code, text,
                              code="request_too_large" if exc.status_code == 413 else None,
                              headers=getattr(exc, "headers", None))

    @app.exception_handler(InflightError)
    async def _inflight(request: Request, exc: InflightError) -> Response:
        if isinstance(exc, SchemaError):
            return error_response(request, 400, exc.message, param=exc.field,
                                  code=exc.code)
        if isinstance(exc, NotFoundError):
            return error_response(request, 404, str(exc), code="not_found")
        if isinstance(exc, StateError):
            return error_response(request, 409, str(exc), code="invalid_state")
        if isinstance(exc, StoreError) and not is_transient(exc) and exc.__cause__ is not None:
            return _internal(request, exc)  # the database refused data: retrying won't help
        if isinstance(exc, (BrokerError, StoreError)):
            log.warning("api: %s %s: %s", request.method, request.url.path, exc)
            wait, what, code = 1, "the database", "store_unavailable"
            if isinstance(exc, BrokerError):
                what, code = "the message broker", "broker_unavailable"
                broker = getattr(getattr(request.app.state, "ctx", None), "broker", None)
                wait = broker.retry_after if broker is not None else 1  # grows while it is down
            return error_response(request, 503, f"{what} is unavailable; retry shortly",
                                  code=code, headers={"Retry-After": str(wait)})
        return _internal(request, exc)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        return _internal(request, exc)


def _internal(request: Request, exc: BaseException) -> Response:
    # NOTE: the client sees only an id; the traceback stays in the server log under it.
    ref = uuid.uuid4().hex[:12]
    log.error("api: internal error %s on %s %s", ref, request.method, request.url.path,
              exc_info=exc)
    return error_response(request, 500, f"internal server error (reference {ref}); "
                          "the details are in the server log")
