"""A SERVER span per HTTP request when OpenTelemetry is on (transport/tracing.py): a child of
the caller's `traceparent` header when it sends one. The submit of the request it files runs
inside it, so the request's Kafka traceparent continues the caller's trace."""

from __future__ import annotations

from typing import Any

from inflight.transport import tracing


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

        given = [(k.decode("latin-1"), v) for k, v in scope.get("headers", ())
                 if k in (b"traceparent", b"tracestate")]
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
