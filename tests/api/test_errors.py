"""Error answers: OpenAI's shape (Anthropic's under /v1/messages), the right statuses,
body caps, and never a stack trace."""

from __future__ import annotations

import pytest
from fastapi import APIRouter

pytestmark = [pytest.mark.broker]


def _error(resp, status: int) -> dict:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert "Traceback" not in resp.text and 'File "' not in resp.text
    return body["error"]


def test_validation_errors_name_the_parameter(bare):
    key = bare.new_key()
    with bare.http(key) as http:
        err = _error(http.post("/v1/requests", json={"prompt": "hi", "bogus": 1}), 400)
        assert err["param"] == "bogus" and "bogus" in err["message"]
        assert err["type"] == "invalid_request_error"
        err = _error(http.post("/v1/requests", json={"prompt": "hi", "messages": [
            {"role": "user", "content": "x"}]}), 400)
        assert "exactly one" in err["message"]
        err = _error(http.post("/v1/requests", json={"prompt": "hi",
                                                     "params": {"temperature": -1}}), 400)
        assert err["param"] == "params.temperature"
        err = _error(http.post("/v1/requests", content=b"{not json",
                               headers={"content-type": "application/json"}), 400)
        assert "JSON" in err["message"]
        err = _error(http.post("/v1/requests", json={"request_id": "bad id!", "prompt": "x"}), 400)
        assert err["param"] == "request_id"
        err = _error(http.get("/v1/requests/bad%20id!"), 400)
        assert err["param"] == "request_id"
        err = _error(http.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "presence_penalty": 2.5}), 400)
        assert err["param"] == "presence_penalty" and "less than or equal to 2" in err["message"]
        err = _error(http.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "n": 2, "stream": True}), 400)
        assert err["param"] == "n" and "without stream" in err["message"]
        err = _error(http.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "n": 17}), 400)
        assert err["param"] == "n" and "less than or equal to 16" in err["message"]


def test_unknown_routes_and_methods(bare):
    key = bare.new_key()
    with bare.http(key) as http:
        assert "unknown URL" in _error(http.get("/v2/nothing"), 404)["message"]
        assert "not allowed" in _error(http.put("/v1/requests/abc"), 405)["message"]
        err = _error(http.get("/v1/requests/never-submitted"), 404)
        assert err["message"] == "No request found with id 'never-submitted'."


def test_anthropic_routes_answer_in_anthropic_shape(bare):
    with bare.http() as http:
        resp = http.get("/v1/messages/nothing-here")
    assert resp.status_code == 404
    body = resp.json()
    assert body == {"type": "error", "error": {"type": "not_found_error",
                                               "message": "unknown URL GET /v1/messages/nothing-here"}}
    with bare.http() as http:
        resp = http.get("/v1/messages/batches")
    assert resp.status_code == 401
    assert resp.json()["error"]["type"] == "authentication_error"


def test_body_caps(bare):
    key = bare.new_key()
    cap = bare.settings.api_max_body_bytes
    with bare.http(key) as http:
        err = _error(http.post("/v1/requests", json={"prompt": "x" * (cap + 10)}), 413)
        assert err["code"] == "request_too_large" and "INFLIGHT_API_MAX_BODY_BYTES" in err["message"]

        def chunks():  # no Content-Length: counted while it arrives
            for _ in range(cap // 1000 + 5):
                yield b" " * 1000

        err = _error(http.post("/v1/requests", content=chunks(),
                               headers={"content-type": "application/json"}), 413)
        assert err["code"] == "request_too_large"


def test_an_unexpected_failure_is_a_500_without_a_trace(bare, caplog):
    router = APIRouter()

    @router.get("/v1/test-boom")
    async def boom():
        raise RuntimeError("secret internals /etc/passwd")

    bare.api.app.include_router(router)
    with bare.http() as http:
        resp = http.get("/v1/test-boom")
    err = _error(resp, 500)
    assert "secret" not in resp.text and "reference" in err["message"]
    ref = err["message"].split("reference ")[1].split(")")[0]
    assert any(ref in r.getMessage() for r in caplog.records)  # the log has it, with the trace


def test_health_and_metrics_need_no_key(bare):
    with bare.http() as http:
        health = http.get("/healthz").json()
        assert health == {"status": "ok", "store": "ok", "auth": True}
        text = http.get("/metrics").text
        assert 'inflight_api_responses_total{method="GET",route="/healthz",status="200"}' in text
        schema = http.get("/openapi.json").json()
    assert "/v1/requests/{request_id}" in schema["paths"]
    assert {"HTTPBearer", "APIKeyHeader"} <= set(schema["components"]["securitySchemes"])
