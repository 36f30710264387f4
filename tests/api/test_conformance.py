"""What OpenAI and Anthropic clients expect of the API's edges, on the API alone (SQLite,
no worker): the key before the body, parse errors with a code, strict types, a lone
surrogate named by its field, exact paging, message batches checked at create."""

from __future__ import annotations

import socket
import time

import anthropic
import openai
import pytest

from tests.api.test_chat import sdk
from tests.api.test_errors import _error

pytestmark = [pytest.mark.broker]

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def _raw(url: str, head: str, body_part: bytes, timeout: float = 10.0) -> bytes:
    """Send headers and only the start of a body; what the server answers meanwhile."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(head.encode() + b"\r\n" + body_part)
        data = b""
        deadline = time.monotonic() + timeout
        while b"\r\n\r\n" not in data and time.monotonic() < deadline:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        return data


def test_the_key_is_checked_before_any_body_is_read(bare):
    # 15 kB declared (under the caps), 10 bytes sent: the 401 comes without the rest
    for path, ctype in (("/v1/files", "multipart/form-data; boundary=x"),
                        ("/v1/chat/completions", "application/json"),
                        ("/v1/messages/batches", "application/json")):
        head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: 15000\r\n")
        answer = _raw(bare.url, head, b"{not json.")
        assert answer.startswith(b"HTTP/1.1 401"), (path, answer[:200])
    with bare.http() as anon:  # a body that is not JSON: still the key's 401, not a 400
        resp = anon.post("/v1/requests", content=b"{nope", headers={"content-type": "application/json"})
        assert resp.status_code == 401 and resp.json()["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize("body, code, param", [
    (b"[" * 5000 + b"]" * 5000, "json_too_deep", None),
    (b'{"prompt": "caf\xe9"}', "invalid_utf8", None),
    (b'{"prompt": "x", "metadata": {"k": "\\ud800"}}', "lone_surrogate", "metadata.k"),
    (b'{"messages": [{"role": "user", "content": "a\\udfffb"}]}', "lone_surrogate",
     "messages.0.content"),
    (b'{"prompt": ', "json_invalid", None),
], ids=["too-deep", "not-utf8", "surrogate-metadata", "surrogate-content", "truncated"])
def test_parse_errors_have_a_code_and_name_the_field(bare, body, code, param):
    with bare.http(bare.new_key()) as http:
        err = _error(http.post("/v1/requests", content=body,
                               headers={"content-type": "application/json"}), 400)
    assert (err["code"], err["param"]) == (code, param), err


def test_chat_types_are_strict_as_openai(bare):
    with bare.http(bare.new_key()) as http:
        for bad, param in [({"max_tokens": "5"}, "max_tokens"), ({"max_tokens": True}, "max_tokens"),
                           ({"temperature": "0.5"}, "temperature"), ({"n": True}, "n"),
                           ({"stream": "yes"}, "stream"), ({"seed": 1.5}, "seed")]:
            err = _error(http.post("/v1/chat/completions", json={**CHAT, **bad}), 400)
            assert err["param"] == param, (bad, err)
        err = _error(http.post("/v1/chat/completions", content=b'{"messages": [{"role": "user", '
                               b'"content": "hi"}], "temperature": NaN}',
                               headers={"content-type": "application/json"}), 400)
        assert err["param"] == "temperature" and "finite" in err["message"], err
        err = _error(http.post("/v1/chat/completions", json={**CHAT, "model": "gpt-9"}), 404)
        assert (err["code"], err["param"]) == ("model_not_found", "model")
        assert "gpt-9" in err["message"]


def test_a_form_content_type_body_is_read_as_json(bare):
    """curl's `-d` says application/x-www-form-urlencoded; the JSON it carries is taken."""
    with bare.http(bare.new_key()) as http:
        resp = http.post("/v1/requests", content=b'{"prompt": "hi", "bogus": 1}',
                         headers={"content-type": "application/x-www-form-urlencoded"})
    assert _error(resp, 400)["param"] == "bogus"  # validated as JSON, not "not an object"


def test_file_pages_end_and_deleted_files_go(bare):
    client = sdk(bare, bare.new_key())
    made = [client.files.create(file=(f"f{i}.jsonl", b"{}\n"), purpose="batch") for i in range(5)]
    newest_first = [f.id for f in reversed(made)]
    page = client.files.list(limit=5)
    assert [f.id for f in page.data] == newest_first and not page.has_more  # exactly full
    page = client.files.list(limit=2)
    assert page.has_more and [f.id for f in page.data] == newest_first[:2]
    assert [f.id for f in client.files.list(limit=2)] == newest_first  # auto-paging ends
    assert [f.id for f in client.files.list(limit=2, after=newest_first[3]).data] == newest_first[4:]
    # order="asc": oldest first, the same cursor paging the other way
    oldest_first = [f.id for f in made]
    assert [f.id for f in client.files.list(order="asc")] == oldest_first
    page = client.files.list(order="asc", limit=2)
    assert page.has_more and [f.id for f in page.data] == oldest_first[:2]
    assert [f.id for f in client.files.list(order="asc", limit=2)] == oldest_first  # pages
    assert [f.id for f in client.files.list(order="asc", limit=2,
                                            after=oldest_first[2]).data] == oldest_first[3:]
    assert [f.id for f in client.files.list(order="desc", limit=5)] == newest_first
    with pytest.raises(openai.BadRequestError) as err:
        client.files.list(order="sideways")
    assert err.value.param == "order"
    gone = client.files.delete(made[0].id)
    assert (gone.id, gone.deleted) == (made[0].id, True)
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(made[0].id)
    with pytest.raises(openai.NotFoundError):
        client.files.delete(made[0].id)
    with pytest.raises(openai.NotFoundError):  # another owner's file is not there for you
        sdk(bare, bare.new_key("other")).files.delete(made[1].id)
    batch = client.batches.create(input_file_id=made[1].id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    with pytest.raises(openai.ConflictError) as err:  # an open batch reads it
        client.files.delete(made[1].id)
    assert batch.id in err.value.message


def test_models_are_listed_and_unknown_ones_are_404(bare):
    """No worker runs: no model is listed; the default model still takes requests (they
    wait in Kafka for its workers), any other name is a 404."""
    client = sdk(bare, bare.new_key())
    assert client.models.list().data == []
    for name in ("SmolLM2-135M-Instruct", "default", "gpt-4o"):
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve(name)
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model="gpt-4o", prompt="hi")
    assert err.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="default", prompt="hi", n=2, stream=True)
    assert err.value.param == "n" and "not supported" in err.value.message
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="default", prompt="hi", max_tokens=0)
    assert err.value.param == "max_tokens"


def test_an_other_owners_cached_answer_is_looked_up_like_an_unknown_id(bare):
    """A 404 for another owner's finished request costs the same store lookup as one for an
    unknown id (a cached answer must not make it measurably faster)."""
    owner, other = bare.new_key("a"), bare.new_key("b")
    ctx = bare.api.ctx
    ctx.finals.put("cached-req", owner.info.owner, b'{"id": "cached-req"}')
    with bare.http(other) as http:
        before = ctx.metrics.values["poll_groups"]
        assert http.get("/v1/requests/cached-req").status_code == 404
        assert ctx.metrics.values["poll_groups"] == before + 1
        assert http.get("/v1/requests/never-made").status_code == 404
        assert ctx.metrics.values["poll_groups"] == before + 2
    with bare.http(owner) as http:  # its owner gets it from the cache, no lookup
        assert http.get("/v1/requests/cached-req").json() == {"id": "cached-req"}
        assert ctx.metrics.values["poll_groups"] == before + 2


def _anthropic(stack, key) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=stack.url, api_key=key.token, max_retries=0, timeout=60)


def test_message_batches_are_checked_at_create_with_the_field_path(bare):
    client = _anthropic(bare, bare.new_key())
    ok = {"custom_id": "a", "params": {"model": "default", "max_tokens": 4,
                                       "messages": [{"role": "user", "content": "hi"}]}}
    cases = [
        ([ok, {"custom_id": "b", "params": {"model": "default",
                                            "messages": ok["params"]["messages"]}}],
         "requests.1.params.max_tokens"),
        ([ok, {**ok, "custom_id": "b", "params": {**ok["params"], "model": "claude-9"}}],
         "requests.1.params.model"),  # a model no worker serves
        ([ok, ok], "requests.1.custom_id"),
        ([{**ok, "params": {**ok["params"], "temperature": "hot"}}], "requests.0.params.temperature"),
        ([{**ok, "params": {**ok["params"], "max_tokens": 10_000_000}}], "requests.0.params.max_tokens"),
    ]
    for requests, path in cases:
        with pytest.raises(anthropic.BadRequestError) as err:
            client.messages.batches.create(requests=requests)
        message = err.value.body["error"]["message"]
        assert message.startswith(".".join(path.split(".")[:2]) + ": "), message
        assert path.split(".", 2)[2] in message, message
    assert list(client.messages.batches.list()) == []  # nothing was created
    made = client.messages.batches.create(requests=[ok])
    # never from the Host header: relative to the API (the SDK joins it to its base URL)
    assert made.results_url is None or made.results_url.startswith("/v1/messages/batches/")
