"""OpenTelemetry traces across the processes (docs/tracing.md): one trace per request,
linked by the W3C `traceparent` header every message of it carries (schemas/headers.py).

    API request (SERVER) ─► inflight.submit (PRODUCER: the Client's send; its context is the
    │                       request's traceparent header)
    └─ inflight.request (CONSUMER, worker: from the request's submit time to its final's ack)
         ├─ inflight.queue_wait     submit → admission by a worker
         ├─ inflight.prefill        admission → first token (prompt / cached token counts)
         ├─ inflight.decode         first token → finished (output token count; no per-token spans)
         └─ inflight.publish_final  final sent → acknowledged by Kafka
       inflight.record (recorder: the database write that stored its row)

On when INFLIGHT_OTEL_EXPORTER_OTLP_ENDPOINT or the standard OTEL_EXPORTER_OTLP_ENDPOINT /
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set (and OTEL_SDK_DISABLED is not true): spans go out
over OTLP/HTTP in batches (opentelemetry-sdk, the `tracing` extra). Off, `tracer()` is None
and every caller skips its tracing with one `is None` test: no spans, no context objects, no
imports of OpenTelemetry. The worker's spans are made after the fact from the times it
records anyway (timestamps given explicitly), so the engine loop never sees a tracer.

NOTE: OpenTelemetry's tracer provider is per process; `install(provider)` sets the one used
here (tests: the SDK's in-memory exporter), else the first `tracer()` that finds tracing on
builds it from the settings once.
"""

from __future__ import annotations

import contextvars
import os
import threading
from typing import Any

from inflight.schemas.headers import TRACEPARENT, TRACESTATE, header_value
from inflight.schemas.settings import Settings

_lock = threading.Lock()
_provider: Any = None           # the process's TracerProvider once built or installed
_OTEL_ENV = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
# tracing off: the trace context an HTTP caller sent (api/tracing.py), which the request it
# files carries on to Kafka instead of a fresh one (producers/requests_client.py)
_caller: contextvars.ContextVar[list | None] = contextvars.ContextVar("inflight_caller_trace",
                                                                     default=None)


def endpoint(settings: Settings) -> str | None:
    """Where spans go (None: tracing is off)."""
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return None
    if settings.otel_exporter_otlp_endpoint:
        return settings.otel_exporter_otlp_endpoint
    for name in _OTEL_ENV:
        if os.environ.get(name):
            return os.environ[name]
    return None


def install(provider: Any) -> None:
    """Use `provider` (an opentelemetry.sdk TracerProvider) for every tracer of this
    process; None: back to the settings (tests)."""
    global _provider
    with _lock:
        _provider = provider


def tracer(settings: Settings, name: str) -> Any:
    """An OpenTelemetry tracer named `name` (inflight.worker, ...), or None when tracing is
    off (see the module doc)."""
    global _provider
    if _provider is None:
        url = endpoint(settings)
        if url is None:
            return None
        with _lock:
            if _provider is None:
                _provider = _otlp_provider(settings, url)
    return _provider.get_tracer(name)


def _otlp_provider(settings: Settings, url: str) -> Any:
    from inflight.schemas.errors import require_extra

    require_extra("tracing", "OpenTelemetry traces", "opentelemetry.sdk",
                  "opentelemetry.exporter.otlp.proto.http")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    if not url.rstrip("/").endswith("/v1/traces"):
        url = url.rstrip("/") + "/v1/traces"
    service = os.environ.get("OTEL_SERVICE_NAME") or settings.otel_service_name
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
    return provider


def flush(timeout_ms: int = 5000) -> None:
    """Export what is buffered (at exit, and in tests)."""
    if _provider is not None:
        _provider.force_flush(timeout_ms)


def caller_context() -> list | None:
    """The traceparent/tracestate headers the current HTTP request came with (tracing off)."""
    return _caller.get()


def set_caller_context(headers: list | None) -> contextvars.Token:
    return _caller.set(headers)


def reset_caller_context(token: contextvars.Token) -> None:
    _caller.reset(token)


# -- context in headers -------------------------------------------------------------------------
def context_from(headers: list | None) -> Any:
    """The OpenTelemetry context of a record's traceparent/tracestate headers (an empty
    context when it carries none or a malformed one)."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier = {}
    for key, value in headers or ():
        key = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
        if key in (TRACEPARENT, TRACESTATE) and key not in carrier:
            carrier[key] = header_value(value).decode("utf-8", "replace")
    return TraceContextTextMapPropagator().extract(carrier)


def inject(context: Any = None) -> list[tuple[str, bytes]]:
    """traceparent (and tracestate) headers of `context` (None: the current one); nothing
    when it has no valid span."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, context=context)
    return [(k, v.encode()) for k, v in carrier.items()]


def ns(epoch_s: float | None) -> int | None:
    """Epoch seconds as the nanoseconds OpenTelemetry takes (None stays None)."""
    return None if epoch_s is None else int(epoch_s * 1e9)
