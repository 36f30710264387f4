"""The worker's OpenTelemetry spans of one request (transport/tracing.py has the picture),
made when it ends, from the times the worker keeps anyway: nothing runs per step or per
token, and nothing at all while tracing is off (the publisher's tracer is None).

    inflight.request         submit (or admission) ─────────────────────► final acknowledged
      inflight.queue_wait    submit → admission
      inflight.prefill       admission → first token
      inflight.decode        first token → finished
      inflight.publish_final final sent → acknowledged (ended by consumers.tracked_sends)
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from inflight.transport import tracing

if TYPE_CHECKING:
    from inflight.consumers.thread_messages import Admitted
    from inflight.engine.outputs import RequestOutput


class OpenSpans:
    """The spans still open at the final's send; `end()` when Kafka acknowledged it."""

    __slots__ = ("root", "publish")

    def __init__(self, root: Any, publish: Any):
        self.root, self.publish = root, publish

    def end(self) -> None:
        now = time.time_ns()
        self.publish.end(end_time=now)
        self.root.end(end_time=now)


def _root(tracer: Any, headers: list, request_id: str, attempt: str | None, start_s: float,
          attrs: dict[str, Any]) -> tuple[Any, Any]:
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind

    root = tracer.start_span("inflight.request", context=tracing.context_from(headers),
                             kind=SpanKind.CONSUMER, start_time=tracing.ns(start_s),
                             attributes={"messaging.system": "kafka",
                                         "messaging.operation.type": "process",
                                         "inflight.request_id": request_id,
                                         "inflight.attempt": attempt or "", **attrs})
    return root, trace.set_span_in_context(root)


def _child(tracer: Any, ctx: Any, name: str, start_s: float | None, end_s: float | None,
           attrs: dict[str, Any]) -> None:
    if start_s is None or end_s is None:
        return
    span = tracer.start_span(name, context=ctx, start_time=tracing.ns(start_s), attributes=attrs)
    span.end(end_time=tracing.ns(max(start_s, end_s)))


def _publish(tracer: Any, ctx: Any, topic: str) -> Any:
    from opentelemetry.trace import SpanKind

    return tracer.start_span("inflight.publish_final", context=ctx, kind=SpanKind.PRODUCER,
                             attributes={"messaging.system": "kafka",
                                         "messaging.destination.name": topic,
                                         "messaging.operation.type": "send"})


def finished(tracer: Any, headers: list, job: Admitted, out: RequestOutput, *, worker: str,
             model: str | None, topic: str) -> OpenSpans:
    """The spans of a request the engine finished (its final is about to be sent)."""
    admitted = job.queued_at
    submitted = job.submitted_at
    start = submitted if submitted is not None and submitted <= admitted else admitted
    root, ctx = _root(tracer, headers, job.request_id, job.attempt, start,
                      {"inflight.worker": worker, "inflight.model": model or "",
                       "inflight.finish_reason": out.finish_reason or "",
                       "inflight.prompt_tokens": out.num_prompt_tokens,
                       "inflight.completion_tokens": len(out.token_ids)})
    _child(tracer, ctx, "inflight.queue_wait", start, admitted, {})
    first = out.first_token_time
    _child(tracer, ctx, "inflight.prefill", admitted, first if first is not None else out.finish_time,
           {"inflight.prompt_tokens": out.num_prompt_tokens,
            "inflight.cached_prompt_tokens": min(out.num_cached_tokens, out.num_prompt_tokens)})
    _child(tracer, ctx, "inflight.decode", first, out.finish_time,
           {"inflight.completion_tokens": len(out.token_ids)})
    return OpenSpans(root, _publish(tracer, ctx, topic))


def ended_without_running(tracer: Any, headers: list, request_id: str, attempt: str | None, *,
                          code: str, message: str, worker: str, topic: str) -> OpenSpans:
    """The spans of a request that ends with an error or a cancel before it ran."""
    from opentelemetry.trace import Status, StatusCode

    root, ctx = _root(tracer, headers, request_id, attempt, time.time(),
                      {"inflight.worker": worker, "inflight.error_code": code})
    if code != "cancelled":
        root.set_status(Status(StatusCode.ERROR, message[:200]))
    return OpenSpans(root, _publish(tracer, ctx, topic))
