"""Embedding requests on the wire, in batch lines, in the store (SQLite and Postgres) and in
batch output lines: float32 little-endian bytes, base64 on JSON."""

from __future__ import annotations

import struct

import orjson
import pytest

from inflight.schemas import FinalEvent, InferenceRequest, SchemaError, decode_request, encode, parse_batch_line
from inflight.schemas.embeddings import decode_vector, encode_vector, pack_vector, unpack_vector

VEC = [0.5, -1.25, 3.0e-8, 1.0e6]


def test_vectors_round_trip_as_float32_little_endian():
    assert pack_vector(VEC) == struct.pack("<4f", *VEC)
    assert unpack_vector(pack_vector(VEC)) == [struct.unpack("<f", struct.pack("<f", v))[0] for v in VEC]
    assert decode_vector(encode_vector(VEC)) == unpack_vector(pack_vector(VEC))
    with pytest.raises(ValueError):
        FinalEvent(request_id="r", text="", finish_reason="stop", embedding="not base64!")
    with pytest.raises(ValueError):
        FinalEvent(request_id="r", text="", finish_reason="stop", embedding="AAA=")  # 2 bytes


def test_embed_requests_validate_their_fields():
    req = decode_request(encode(InferenceRequest(request_id="e1", prompt="hi", kind="embed", dimensions=8)))
    assert (req.kind, req.dimensions) == ("embed", 8)
    with pytest.raises(SchemaError, match="messages"):
        decode_request(orjson.dumps({"request_id": "e2", "kind": "embed",
                                     "messages": [{"role": "user", "content": "x"}]}))
    with pytest.raises(SchemaError, match="dimensions"):
        decode_request(orjson.dumps({"request_id": "e3", "prompt": "x", "dimensions": 4}))


def test_openai_batch_lines_for_embeddings():
    line = {"custom_id": "c1", "method": "POST", "url": "/v1/embeddings",
            "body": {"model": "m", "input": "some text", "dimensions": 16}}
    req = parse_batch_line(orjson.dumps(line))
    assert (req.kind, req.prompt, req.model, req.dimensions) == ("embed", "some text", "m", 16)
    req = parse_batch_line(orjson.dumps({**line, "body": {"input": [[5, 6, 7]]}}))
    assert req.prompt_token_ids == [5, 6, 7]
    for body, field in (({"input": ["a", "b"]}, "body.input"), ({"input": "a", "max_tokens": 3}, "body.max_tokens"),
                        ({"input": "a", "encoding_format": "base64"}, "body.encoding_format"),
                        ({"model": "m"}, "body.input")):
        with pytest.raises(SchemaError) as e:
            parse_batch_line(orjson.dumps({**line, "body": body}))
        assert e.value.field == field


def test_the_vector_is_stored_and_written_as_openai_does(db_url):
    from inflight.producers.batch_output import openai_line
    from inflight.store import Store, final_row

    store = Store(db_url, create=True)
    try:
        rid = f"emb-{id(store)}"
        event = FinalEvent(request_id=rid, text="", finish_reason="stop", embedding=encode_vector(VEC),
                           usage={"prompt_tokens": 5})
        store.upsert_requests([final_row(event)])
        assert store.get_request(rid).embedding == pack_vector(VEC)
        row = store.result_rows([rid])[rid]
        line, is_error = openai_line("c1", rid, row, endpoint="/v1/embeddings", model="m",
                                     batch_status="completed")
        assert not is_error
        body = line["response"]["body"]
        assert body["object"] == "list" and body["usage"] == {"prompt_tokens": 5, "total_tokens": 5}
        assert body["data"] == [{"object": "embedding", "index": 0, "embedding": unpack_vector(pack_vector(VEC))}]
        plain = FinalEvent(request_id=rid + "g", text="hi", finish_reason="stop")
        store.upsert_requests([final_row(plain)])
        assert store.get_request(rid + "g").embedding is None
    finally:
        store.close()
