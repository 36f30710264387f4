"""Input the API must answer with a 4xx that names the problem, never a 5xx (found by
probing the real stack with the SDKs, httpx and raw bodies): a lone surrogate in a key,
numbers and nesting the encoder cannot write again, an empty key, a NUL that Postgres
refuses, a file name no header can carry, a compressed body; answered completions giving
their stream slot back; listing files while deleting them."""

from __future__ import annotations

import gzip

import pytest

from tests.api.test_chat import sdk
from tests.api.test_errors import _error

pytestmark = [pytest.mark.broker]

JSON = {"content-type": "application/json"}
MSG = b'"messages": [{"role": "user", "content": "x"}]'


def _batch(params: bytes) -> bytes:
    return b'{"requests": [{"custom_id": "a", "params": {' + params + b'}}]}'


def test_keys_and_numbers_the_encoder_refuses_are_400s(bare):
    deep = b"[" * 230 + b"]" * 230
    with bare.http(bare.new_key()) as http:
        for path, body, param in [
            ("/v1/chat/completions", b'{' + MSG + b', "metadata": {"\\ud800": "v"}}',
             "metadata.\\ud800"),
            ("/v1/requests", b'{"prompt": "hi", "k\\udc00": 1}', "k\\udc00"),
            ("/v1/requests", b'{"prompt": "hi", "metadata": {"k": 1' + b"0" * 400 + b'}}',
             "metadata.k"),
            ("/v1/requests", b'{"prompt": "hi", "": 1}', ""),
            # a union's member names are not fields (was `messages.0.content.str`)
            ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": 5}]}',
             "messages.0.content"),
            ("/v1/completions", b'{"model": "m", "prompt": [[1], [2]]}', "prompt"),
        ]:
            err = _error(http.post(path, content=body, headers=JSON), 400)
            assert err["param"] == param, (body[:60], err)
        for params, words in [
            (b'"\\ud800": 1, "max_tokens": 2, ' + MSG, "requests.0.params.\\ud800"),
            (b'"max_tokens": 1' + b"0" * 400 + b', ' + MSG, "params.max_tokens"),
            (b'"max_tokens": 2, "temperature": NaN, ' + MSG, "finite"),  # not "got None"
            (b'"max_tokens": 2, "metadata": ' + deep + b', ' + MSG, "nested more than"),
        ]:
            resp = http.post("/v1/messages/batches", content=_batch(params), headers=JSON)
            assert resp.status_code == 400, resp.text
            assert words in resp.json()["error"]["message"], resp.text
        # the connection is still good (a 500 used to reset the client's next request)
        assert http.get("/v1/models").status_code == 200


def test_answered_completions_give_their_stream_slot_back(stack):
    """Every answered (not streamed) completion used to keep its slot: after
    INFLIGHT_API_MAX_STREAMS of them, every chat and text completion was a 503."""
    client = sdk(stack, stack.new_key())
    metrics = stack.api.ctx.metrics
    before = metrics.open_streams
    for _ in range(2):
        client.chat.completions.create(model="tiny", max_tokens=1,
                                       messages=[{"role": "user", "content": "hi"}])
        client.completions.create(model="tiny", prompt="hi", max_tokens=1)
    assert metrics.open_streams <= before


def test_deleting_files_while_listing_them_ends(bare):
    """`for f in client.files.list(): client.files.delete(f.id)` over more files than the
    old page of 100: one page (OpenAI's default is 10,000), so no cursor it just deleted."""
    client = sdk(bare, bare.new_key())
    made = {client.files.create(file=(f"f{i}.jsonl", b"{}\n"), purpose="batch").id
            for i in range(101)}
    deleted = {f.id for f in client.files.list() if client.files.delete(f.id).deleted}
    assert deleted == made and list(client.files.list()) == []
    with bare.http(bare.new_key()) as http:  # a cursor that names no file says which
        err = _error(http.get("/v1/files", params={"after": sorted(made)[0]}), 404)
        assert err["param"] == "after" and "without `after`" in err["message"]


def test_a_nul_in_an_id_or_filter_is_a_4xx_on_both_databases(stack):
    """Postgres refuses a NUL in any text it is sent: ids and filters that no row can
    match are answered without a lookup, batch metadata with one is refused."""
    key = stack.new_key()
    with stack.http(key) as http:
        for path, params in [("/v1/files", {"after": "a\x00"}), ("/v1/files", {"purpose": "a\x00"}),
                             ("/v1/batches", {"after": "a\x00"}),
                             ("/v1/messages/batches", {"after_id": "a\x00"})]:
            resp = http.get(path, params=params)
            assert resp.status_code in (400, 404), (path, resp.text)
        fid = http.post("/v1/files", files={"file": ("a.jsonl", b"{}\n")},
                        data={"purpose": "batch"}).json()["id"]
        for body, param in [({"input_file_id": "file-\x00"}, "input_file_id"),
                            ({"input_file_id": fid, "metadata": {"k": "v\x00"}}, "metadata")]:
            resp = http.post("/v1/batches", json={"endpoint": "/v1/chat/completions", **body})
            assert resp.status_code in (400, 404) and resp.json()["error"]["param"] == param, \
                resp.text


def test_odd_file_names_download_and_compressed_bodies_are_refused(bare):
    with bare.http(bare.new_key()) as http:
        made = http.post("/v1/files", files={"file": ("a\x7f\u00e9.jsonl", b"{}\n")},
                         data={"purpose": "batch"}).json()
        got = http.get(f"/v1/files/{made['id']}/content")  # a DEL in a header dropped it
        assert got.status_code == 200 and got.content == b"{}\n"
        assert got.headers["content-disposition"] == (
            "attachment; filename=\"a__.jsonl\"; filename*=UTF-8''a%7F%C3%A9.jsonl")
        resp = http.post("/v1/requests", content=gzip.compress(b'{"prompt": "hi"}'),
                         headers={**JSON, "content-encoding": "gzip"})
        assert _error(resp, 415)["code"] == "unsupported_content_encoding"
