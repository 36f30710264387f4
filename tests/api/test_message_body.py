"""A Message Batches body read as it arrives (api/message_body.py): the requests cut out
of any piece sizes exactly as a whole-body parse finds them, bad bodies refused as before,
and memory bounded by the largest request, not the body (tracemalloc)."""

from __future__ import annotations

import random
import tracemalloc

import orjson
import pytest

from inflight.api.errors import APIError
from inflight.api.message_body import RequestItems, message_batch_lines
from inflight.schemas import Settings

SETTINGS = Settings(api_max_line_bytes=400_000, api_max_upload_lines=50_000)


def request(i: int, text: str) -> dict:
    return {"custom_id": f"c{i}", "params": {"max_tokens": 8, "messages": [
        {"role": "user", "content": text}]}}


def pieces(body: bytes, size: int):
    for i in range(0, len(body), size):
        yield body[i:i + size]


def split(body: bytes, size: int) -> list[bytes]:
    items = RequestItems(1 << 20)
    out = [item for piece in pieces(body, size) for item in items.feed(piece)]
    items.finish()
    return out


TRICKY = ['plain', 'with "quotes" and \\ backslashes', 'brackets ] [ } { and , commas',
          'ünïcödé 🙂 \u2028', 'ends in a backslash \\', '"', '']


@pytest.mark.parametrize("size", [1, 3, 7, 64, 1 << 16])
def test_the_requests_are_cut_out_as_a_whole_parse_finds_them(size):
    reqs = [request(i, t) for i, t in enumerate(TRICKY)]
    reqs.append({"custom_id": "n", "params": {"nested": [[1, {"a": [2, "]"]}], {}],
                                              "x": None, "y": -1.5e3, "z": True}})
    body = b'\xef\xbb\xbf \n{ "requests" :\n [ ' + b" ,\n ".join(
        orjson.dumps(r) for r in reqs) + b" ] \n}\n"
    assert [orjson.loads(x) for x in split(body, size)] == orjson.loads(body[3:])["requests"]


@pytest.mark.parametrize("body, where", [
    (b'[]', None), (b'{"requests": []}', "requests"), (b'{"other": [1]}', None),
    (b'{"requests": [{"a": 1}, ]}', "requests.1"), (b'{"requests": [{"a": 1},, {}]}',
                                                    "requests.1"),
    (b'{"requests": [{"a": 1}]', None), (b'{"requests": [{"a": 1}]} trailing', None),
    (b'{"requests": [{"a": 1}], "more": 2}', None), (b'{"requests": {"a": 1}}', None),
    (b'{"requests": [{"a": 1}}]}', "requests.0")])
def test_bad_bodies_are_refused_naming_where(body, where):
    with pytest.raises(APIError) as err:
        split(body, 5)
    assert err.value.status == 400 and err.value.param == where


def test_a_bad_request_refuses_the_batch_with_its_field():
    body = orjson.dumps({"requests": [request(0, "fine"), {"custom_id": "b", "params": {
        "max_tokens": 8, "messages": [{"role": "user", "content": "x"}], "tools": []}}]})
    with pytest.raises(APIError) as err:
        list(message_batch_lines(pieces(body, 100), batch_id="b", settings=SETTINGS,
                                 context=None))
    assert err.value.param == "requests.1.params.tools"


def test_a_request_over_the_line_cap_is_refused_before_it_is_held():
    settings = Settings(api_max_line_bytes=10_000)
    huge = b'{"requests": [{"custom_id": "h", "params": {"messages": "' + b"x" * 10**6
    with pytest.raises(APIError) as err:
        list(message_batch_lines(pieces(huge, 4096), batch_id="b", settings=settings,
                                 context=None))
    assert err.value.status == 413 and err.value.param == "requests.0"


def peak_reading(count: int, text: str) -> tuple[int, int]:
    """(tracemalloc peak, body bytes) of reading a body of `count` requests, generated
    piece by piece (never held whole), in 64 KiB pieces."""
    def body():
        yield b'{"requests": ['
        for i in range(count):
            yield (b"," if i else b"") + orjson.dumps(request(i, text))
        yield b"]}"

    def rechunked(size: int = 65536):
        buf = bytearray()
        for part in body():
            buf += part
            while len(buf) >= size:
                yield bytes(buf[:size])
                del buf[:size]
        yield bytes(buf)

    tracemalloc.start()
    try:
        n = total = 0
        base = tracemalloc.get_traced_memory()[0]
        for line in message_batch_lines(rechunked(), batch_id="b", settings=SETTINGS,
                                        context=None):
            n += 1
            total += len(line)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert n == count
    return peak, total


def test_memory_is_bounded_by_the_largest_request_not_the_body():
    """The peak while reading 120 requests of 100 KB (a 12 MB body) is what reading 30 of
    them costs: a few requests' worth (each is parsed and checked on its own), not the
    body (reading it whole held it, its parse and a line per request at once)."""
    text = " ".join(f"w{i % 977}" for i in range(25_000))[:100_000]
    small, _ = peak_reading(30, text)
    peak, total = peak_reading(120, text)
    assert total > 12_000_000
    assert peak < small * 1.3 + 200_000, (small, peak)
    assert peak < total / 3, f"peak {peak:,} bytes for a {total:,}-byte body"


@pytest.mark.broker
def test_a_chunked_body_through_the_api(bare):
    """Through the real API: a body sent in small pieces (chunked) becomes the batch's
    input file line by line; one bad request in it refuses the batch and stores nothing."""
    key = bare.new_key()
    reqs = [request(i, t) for i, t in enumerate(TRICKY) if t]   # (an empty one is refused)
    body = orjson.dumps({"requests": reqs})
    with bare.http(key) as http:
        made = http.post("/v1/messages/batches", content=pieces(body, 37),
                         headers={"content-type": "application/json"})
        assert made.status_code == 200, made.text
        row = bare.store.require_batch(made.json()["id"])
        lines = [orjson.loads(x) for _, x in bare.store.iter_file_lines(row.input_file_id)]
        assert lines == reqs
        files_before = len(bare.store.list_files(owner=key.info.owner, limit=100))
        bad = orjson.dumps({"requests": reqs + [{"custom_id": "x", "params": []}]})
        refused = http.post("/v1/messages/batches", content=pieces(bad, 37),
                            headers={"content-type": "application/json"})
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["type"] == "invalid_request_error"
        assert "requests.6" in refused.json()["error"]["message"]
        assert len(bare.store.list_files(owner=key.info.owner, limit=100)) == files_before
