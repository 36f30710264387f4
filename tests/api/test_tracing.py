"""OpenTelemetry across the real path: the API (uvicorn) → Kafka → worker → recorder, every
part with the SDK's in-memory exporter (one provider for the test process: the parts run in
its threads). One trace, continuing the caller's traceparent, with every span parented as
transport/tracing.py draws it; the stored row's trace id is that trace's."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest

from tests.api.server import ApiServer
from tests.consumers.conftest import Service, make_settings, migrated, tiny_engine, wait_rows

pytestmark = [pytest.mark.broker]

CALLER_TRACE = "5b8aa5a2d2c872e8321cf37308d69df2"
CALLER_SPAN = "051581bf3cb55c13"


@pytest.fixture
def traced(broker, tiny_model, tmp_path):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from inflight.store import Store
    from inflight.transport import tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    url = migrated(f"sqlite:///{tmp_path / 'inflight.db'}")
    settings = make_settings(broker, url, model_path=str(tiny_model), served_model_name="tiny",
                             api_key_cache_s=0.0, data_dir=tmp_path / "data",
                             cache_dir=tmp_path / "cache")
    store = Store(url)
    service = Service(settings, tiny_engine(tiny_model), store)
    try:
        with ApiServer(settings) as api:
            yield api, store, exporter
    finally:
        service.stop()
        tracing.install(None)
        store.close()


def _wait_spans(exporter, rid: str, timeout: float = 30.0) -> list:
    deadline = time.monotonic() + timeout
    while True:
        spans = exporter.get_finished_spans()
        mine = [s for s in spans if s.context.trace_id == int(CALLER_TRACE, 16)]
        names = {s.name for s in mine}
        if {"inflight.record", "inflight.publish_final", "inflight.request"} <= names:
            return mine
        assert time.monotonic() < deadline, sorted(names)
        time.sleep(0.05)


def test_one_trace_from_the_api_to_the_stored_row(traced):
    from inflight.api.keys import create_key

    api, store, exporter = traced
    key = create_key(store, "tracing")
    rid = f"traced-{uuid.uuid4().hex[:8]}"
    caller = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
    with httpx.Client(base_url=api.url, timeout=60,
                      headers={"Authorization": f"Bearer {key.token}",
                               "traceparent": caller}) as http:
        r = http.post("/v1/requests", json={"request_id": rid, "prompt": "one two three",
                                            "params": {"max_tokens": 6, "temperature": 0}})
        assert r.status_code == 202, r.text
    row = wait_rows(store, [rid], timeout=60)[rid]
    assert row.status == "completed"
    spans = _wait_spans(exporter, rid)
    by_name = {}
    for s in spans:
        by_name.setdefault(s.name, []).append(s)

    def parent(s):
        return s.parent.span_id if s.parent is not None else None

    (server,) = by_name["POST /v1/requests"]
    (submit,) = by_name["inflight.submit"]
    (root,) = by_name["inflight.request"]
    assert parent(server) == int(CALLER_SPAN, 16)
    assert parent(submit) == server.context.span_id
    assert submit.attributes["inflight.request_id"] == rid
    assert parent(root) == submit.context.span_id
    for name in ("inflight.queue_wait", "inflight.prefill", "inflight.decode",
                 "inflight.publish_final"):
        (child,) = by_name[name]
        assert parent(child) == root.context.span_id, name
        assert child.start_time <= child.end_time
    assert by_name["inflight.decode"][0].attributes["inflight.completion_tokens"] == 6
    assert by_name["inflight.prefill"][0].attributes["inflight.prompt_tokens"] >= 1
    (record,) = by_name["inflight.record"]
    assert parent(record) == submit.context.span_id
    assert record.attributes["inflight.request_id"] == rid
    # the phases in order, inside the worker's span
    q, p, d = (by_name[n][0] for n in ("inflight.queue_wait", "inflight.prefill",
                                        "inflight.decode"))
    assert root.start_time <= q.start_time <= q.end_time <= p.start_time + 1_000_000
    assert p.end_time <= d.start_time + 1_000_000 and d.end_time <= root.end_time
    # one trace, and the stored row points at it
    assert {s.context.trace_id for s in spans} == {int(CALLER_TRACE, 16)}
    assert row.trace_id == CALLER_TRACE


def test_tracing_is_off_without_an_endpoint_and_on_with_one(monkeypatch):
    from inflight.schemas import Settings
    from inflight.transport import tracing

    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                 "OTEL_SDK_DISABLED"):
        monkeypatch.delenv(name, raising=False)
    assert tracing.endpoint(Settings()) is None and tracing.tracer(Settings(), "x") is None
    on = Settings(otel_exporter_otlp_endpoint="http://127.0.0.1:4318")
    assert tracing.endpoint(on) == "http://127.0.0.1:4318"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    assert tracing.endpoint(Settings()) == "http://collector:4318"
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert tracing.endpoint(on) is None


def test_tracing_off_the_callers_traceparent_still_reaches_kafka(bare):
    """No OTLP endpoint: the API files the request with the HTTP caller's traceparent and
    tracestate (a malformed one: a fresh trace instead)."""
    from inflight.api.keys import create_key
    from tests.consumers.conftest import read_topic

    key = create_key(bare.store, "trace-off")
    caller = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01".encode()
    ids = {}
    with bare.http(key) as http:
        for name, header in (("valid", caller), ("malformed", b"00-nothex-01")):
            rid = f"{name}-{uuid.uuid4().hex[:8]}"
            r = http.post("/v1/requests", json={"request_id": rid, "prompt": "x"},
                          headers={"traceparent": header.decode(), "tracestate": "v=1"})
            assert r.status_code == 202, r.text
            ids[name] = rid.encode()
    recs = read_topic(bare.settings, bare.settings.topic_requests,
                      until=lambda rs: set(ids.values()) <= {r.key for r in rs})
    got = {r.key: dict(r.headers) for r in recs if r.key in ids.values()}
    assert got[ids["valid"]]["traceparent"] == caller
    assert got[ids["valid"]]["tracestate"] == b"v=1"
    fresh = got[ids["malformed"]]["traceparent"]
    assert fresh != b"00-nothex-01" and len(fresh) == 55
    assert got[ids["valid"]]["inflight-request-id"] == ids["valid"]


def test_spans_reach_a_real_otlp_http_receiver(monkeypatch):
    """The settings path (no provider installed): the SDK's OTLP/HTTP exporter posts the
    spans to INFLIGHT_OTEL_EXPORTER_OTLP_ENDPOINT + /v1/traces, service name and all."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from inflight.schemas import Settings
    from inflight.transport import tracing

    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SERVICE_NAME", "OTEL_SDK_DISABLED"):
        monkeypatch.delenv(name, raising=False)
    got: list[tuple[str, bytes]] = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            got.append((self.path, self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    tracing.install(None)
    try:
        settings = Settings(otel_exporter_otlp_endpoint=f"http://127.0.0.1:{server.server_port}",
                            otel_service_name="inflight-test")
        tracer = tracing.tracer(settings, "inflight.worker")
        with tracer.start_as_current_span("inflight.request", attributes={"inflight.request_id": "r1"}):
            pass
        tracing.flush()
        assert got and got[0][0] == "/v1/traces"
        req = ExportTraceServiceRequest.FromString(got[0][1])
        (rs,) = req.resource_spans
        service = {a.key: a.value.string_value for a in rs.resource.attributes}["service.name"]
        spans = [s for ss in rs.scope_spans for s in ss.spans]
        assert service == "inflight-test" and [s.name for s in spans] == ["inflight.request"]
    finally:
        provider = tracing._provider
        tracing.install(None)
        if provider is not None:
            provider.shutdown()
        server.shutdown()
