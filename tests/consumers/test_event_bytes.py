"""The worker's hand-built events (orjson, no pydantic) are exactly the wire models, and its
DLQ copies survive whatever headers and sizes a producer sent."""

from __future__ import annotations

import orjson

from inflight.consumers import event_bytes
from inflight.consumers.dlq import TRUNCATED_BODY_BYTES, dlq_headers, dlq_value
from inflight.engine import RequestOutput
from inflight.schemas import (ErrorEvent, FinalEvent, StatusEvent, Timings, TokenEvent, Usage,
                     decode_result)


def test_each_builder_decodes_to_the_model_it_stands_for():
    out = RequestOutput("a.1", [], "", [5, 6, 7], "héllo\x00 🙂", True, "stop",
                        num_prompt_tokens=4, num_cached_tokens=9, arrival_time=1.0,
                        first_token_time=2.0, finish_time=3.0)
    cases = [
        (event_bytes.token_event("r-1", "g.1", 2, 5, [1, 2], "ab"),
         TokenEvent(request_id="r-1", attempt="g.1", index=2, start=5, token_ids=[1, 2], text="ab")),
        (event_bytes.status_event("r-1", "g.1", "host:1", 12.5),
         StatusEvent(request_id="r-1", attempt="g.1", worker="host:1", at=12.5)),
        (event_bytes.final_event("r-1", "g.1", out, worker="w", batch_id="b", submitted_at=0.5,
                                 queued_at=0.75),
         FinalEvent(request_id="r-1", attempt="g.1", text="héllo\x00 🙂", token_ids=[5, 6, 7],
                    finish_reason="stop", worker="w", batch_id="b",
                    usage=Usage(prompt_tokens=4, completion_tokens=3, cached_prompt_tokens=4),
                    timings=Timings(submitted_at=0.5, queued_at=0.75, first_token_at=2.0,
                                    finished_at=3.0))),
        (event_bytes.abort_event("r-1", "g.2", worker="w", batch_id=None, submitted_at=None,
                                 queued_at=1.0, now=2.0),
         FinalEvent(request_id="r-1", attempt="g.2", text="", finish_reason="abort", worker="w",
                    timings=Timings(queued_at=1.0, finished_at=2.0))),
        (event_bytes.error_event(None, None, "invalid_request", "not JSON", field=None,
                                 worker="w", batch_id=None),
         ErrorEvent(request_id=None, code="invalid_request", message="not JSON", worker="w")),
    ]
    out.stop_reason = "\n\n"  # a stop string ended it
    cases.append((event_bytes.final_event("r-1", "g.1", out, worker="w", batch_id=None,
                                          submitted_at=None, queued_at=0.75),
                  FinalEvent(request_id="r-1", attempt="g.1", text="héllo\x00 🙂",
                             token_ids=[5, 6, 7], finish_reason="stop", worker="w",
                             stop_reason="\n\n",
                             usage=Usage(prompt_tokens=4, completion_tokens=3,
                                         cached_prompt_tokens=4),
                             timings=Timings(queued_at=0.75, first_token_at=2.0,
                                             finished_at=3.0))))
    for data, model in cases:
        assert decode_result(data) == model


def test_dlq_headers_make_any_header_sendable():
    headers = dlq_headers([("ok", b"1"), ("null", None), (b"\xffkey", b"v"), ("s\udcff", "text")],
                          "invalid_request", "bad " * 2000, "t/0/5")
    assert all(isinstance(k, str) and isinstance(v, bytes) for k, v in headers)
    for k, _ in headers:
        k.encode("utf-8")  # what kafka-python's producer does with a key: must not raise
    d = dict(headers)
    assert d["ok"] == b"1" and d["null"] == b"" and d["\\xffkey"] == b"v"
    assert d["inflight-error-code"] == b"invalid_request" and len(d["inflight-error"]) == 4000
    assert d["inflight-source"] == b"t/0/5"


def test_dlq_value_truncates_then_goes_bare():
    headers = dlq_headers([("trace", b"x" * 100)], "message_too_large", "too big", "t/0/1")
    small, same = dlq_value(b"{}", headers, 1000)
    assert small == b"{}" and same == headers
    big = orjson.dumps({"prompt": "x" * 2_000_000})
    body, cut = dlq_value(big, headers, 1_000_000)
    assert body == big[:TRUNCATED_BODY_BYTES] and dict(cut)["trace"] == b"x" * 100
    assert dict(cut)["inflight-original-bytes"] == str(len(big)).encode()
    body, bare = dlq_value(body, cut, 1_000_000, bare=True)
    assert body == b"" and "trace" not in dict(bare)
    assert dict(bare)["inflight-original-bytes"] == str(len(big)).encode()
    assert dict(bare)["inflight-error-code"] == b"message_too_large"
