"""Record headers (schemas/headers.py): ours set from the event, everything else copied."""

from __future__ import annotations

from inflight.schemas.headers import (event_headers, get_header, message_headers,
                                      new_traceparent, trace_id)

TP = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_every_message_carries_content_type_and_version():
    assert message_headers() == [("content-type", b"application/json"), ("schema-version", b"1")]
    assert message_headers("r1", "acme")[2:] == [("inflight-request-id", b"r1"),
                                                 ("inflight-tenant", b"acme")]


def test_event_headers_set_ours_and_copy_the_rest_in_order():
    request = [("content-type", b"text/plain"), ("traceparent", TP), ("x-a", None),
               (b"x-b\xff", b"\x00"), ("inflight-request-id", b"spoofed"),
               ("inflight-tenant", b"theirs"), ("tracestate", b"k=v"), ("x-a", b"2")]
    out = event_headers(request, "r1")
    assert out[:3] == message_headers("r1")
    assert out[3:] == [("traceparent", TP), ("x-a", b""), ("x-b\\xff", b"\x00"),
                       ("inflight-tenant", b"theirs"), ("tracestate", b"k=v"), ("x-a", b"2")]
    # a request that names its tenant: ours wins, the producer's header of that name goes
    out = event_headers(request, "r1", tenant="acme")
    assert [v for k, v in out if k == "inflight-tenant"] == [b"acme"]


def test_trace_id_only_from_a_well_formed_traceparent():
    assert trace_id([("traceparent", TP)]) == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert trace_id([(b"traceparent", TP.upper())]) == "4bf92f3577b34da6a3ce929d0e0e4736"
    for bad in (b"", b"garbage", b"01-" + TP[3:], TP[:-1], b"00-" + b"0" * 32 + TP[35:],
                TP[:36] + b"0" * 16 + TP[52:]):
        assert trace_id([("traceparent", bad)]) is None, bad
    assert trace_id(None) is None and trace_id([("x", b"1")]) is None
    fresh = new_traceparent()
    assert trace_id([("traceparent", fresh)]) == fresh[3:35].decode()
    assert get_header([("a", None)], "a") == b""
