"""Input the API must answer with a 4xx that names the problem, never a 5xx (found by
probing the real stack with the SDKs, httpx and raw bodies): a lone surrogate in a key,
numbers and nesting the encoder cannot write again, an empty key; answered completions
giving their stream slot back; listing files while deleting them."""

from __future__ import annotations

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
