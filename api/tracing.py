"""A SERVER span per HTTP request when OpenTelemetry is on (transport/tracing.py): a child of
the caller's `traceparent` header when it sends one. The submit of the request it files runs
inside it, so the request's Kafka traceparent continues the caller's trace."""

from __future__ import annotations

from typing import Any

from inflight.schemas.headers import trace_id
from inflight.transport import tracing


def _trace_headers(scope: dict) -> list[tuple[str, bytes]]:
    """The caller's traceparent / tracestate headers, as the Kafka header list takes them."""
    return [(k.decode("latin-1"), v) for k, v in scope.get("headers", ())
            if k in (b"traceparent", b"tracestate")]


class TracingMiddleware:
    """Pure ASGI: the span covers the whole response, streamed bodies included."""

    def __init__(self, app: Any, tracer: Any):
        self.app = app
        self.tracer = tracer

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from opentelemetry.trace import SpanKind, Status, StatusCode

        given = _trace_headers(scope)
        method, path = scope.get("method", "GET"), scope.get("path", "")
        with self.tracer.start_as_current_span(
                f"{method} {path}", context=tracing.context_from(given), kind=SpanKind.SERVER,
                attributes={"http.request.method": method, "url.path": path}) as span:

            async def send_traced(message: dict) -> None:
                if message["type"] == "http.response.start":
                    span.set_attribute("http.response.status_code", message["status"])
                    if message["status"] >= 500:
                        span.set_status(Status(StatusCode.ERROR))
                await send(message)

            await self.app(scope, receive, send_traced)
            route = getattr(scope.get("route"), "path", None)
            if route:  # the route's template, not the path: /v1/requests/{request_id}
                span.update_name(f"{method} {route}")
                span.set_attribute("http.route", route)


class TraceparentMiddleware:
    """Tracing off: an HTTP caller's valid `traceparent` (and `tracestate`) still reach
    Kafka: the request filed while serving it carries them instead of a fresh trace id."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = _trace_headers(scope)
        if not given or trace_id(given) is None:
            await self.app(scope, receive, send)
            return
        token = tracing.set_caller_context(given)
        try:
            await self.app(scope, receive, send)
        finally:
            tracing.reset_caller_context(token)
