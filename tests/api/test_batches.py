"""OpenAI Files + Batches through the API, driven by the official openai SDK: upload,
create, poll to completion, read every output line (equal to a direct engine run by
custom_id), list with paging, cancel; owners and upload caps."""

from __future__ import annotations

import time
import uuid

import openai
import orjson
import pytest

from tests.api.test_chat import sdk
from tests.tiny_llama import SENTENCES

pytestmark = [pytest.mark.broker]

CHAT = "/v1/chat/completions"


def line(cid: str, content: str, **body) -> dict:
    return {"custom_id": cid, "method": "POST", "url": CHAT,
            "body": {"model": "tiny", "messages": [{"role": "user", "content": content}], **body}}


def jsonl(rows: list[dict]) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in rows)


def wait_batch(client: openai.OpenAI, batch_id: str, timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    while True:
        b = client.batches.retrieve(batch_id)
        if b.status in ("completed", "failed", "expired", "cancelled"):
            return b
        assert time.monotonic() < deadline, f"batch still {b.status}"
        time.sleep(0.2)


def engine_reference(model, items):
    """{custom_id: RequestOutput} of the same chats run straight on a fresh engine."""
    from inflight.engine import SamplingParams as EP
    from tests.consumers.conftest import finals_of, tiny_engine

    eng = tiny_engine(model)
    for cid, content, max_tokens in items:
        eng.add_request(cid, messages=[{"role": "user", "content": content}],
                        params=EP(max_tokens=max_tokens, temperature=0.0))
    return finals_of(eng)


def test_a_whole_batch_with_the_openai_sdk(stack):
    key = stack.new_key()
    client = sdk(stack, key)
    words = " ".join(SENTENCES).split()
    items = [(f"q{i}", " ".join(words[i:i + 3 + i % 4]), 3 + i) for i in range(6)]
    upload = client.files.create(file=("nightly.jsonl", jsonl(
        [line(cid, text, max_tokens=n, temperature=0) for cid, text, n in items])),
        purpose="batch")
    assert (upload.object, upload.purpose, upload.filename) == ("file", "batch", "nightly.jsonl")
    assert client.files.retrieve(upload.id).bytes == upload.bytes
    batch = client.batches.create(input_file_id=upload.id, endpoint=CHAT,
                                  completion_window="24h", metadata={"night": "1"})
    assert batch.status == "validating" and batch.metadata == {"night": "1"}
    done = wait_batch(client, batch.id)
    assert done.status == "completed" and done.request_counts.completed == len(items)
    assert done.request_counts.total == len(items) and done.request_counts.failed == 0
    lines = [orjson.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
    ref = engine_reference(stack.model, items)
    assert sorted(x["custom_id"] for x in lines) == sorted(ref)
    for x in lines:
        body = x["response"]["body"]
        assert x["error"] is None and x["response"]["status_code"] == 200
        assert body["object"] == "chat.completion"
        assert body["choices"][0]["message"]["content"] == ref[x["custom_id"]].text
        assert body["usage"]["completion_tokens"] == len(ref[x["custom_id"]].token_ids)
    assert done.error_file_id is None
    # another key sees none of it
    other = sdk(stack, stack.new_key("other"))
    for call in (lambda: other.batches.retrieve(batch.id), lambda: other.files.retrieve(upload.id),
                 lambda: other.files.content(done.output_file_id),
                 lambda: other.batches.cancel(batch.id),
                 lambda: other.batches.create(input_file_id=upload.id, endpoint=CHAT,
                                              completion_window="24h")):
        with pytest.raises(openai.NotFoundError):
            call()
    assert other.batches.list().data == []


def test_list_pages_and_cancel(stack):
    key = stack.new_key()
    client = sdk(stack, key)
    bad = client.files.create(file=("bad.jsonl", jsonl([line("a", "hi", max_tokens=2),
                                                         {"custom_id": "b", "nope": 1}])),
                              purpose="batch")
    failed = wait_batch(client, client.batches.create(
        input_file_id=bad.id, endpoint=CHAT, completion_window="24h").id)
    assert failed.status == "failed" and failed.errors.data[0].line == 2
    slow = client.files.create(file=("slow.jsonl", jsonl(
        [line(f"l{i}", "hello", max_tokens=480, ignore_eos=True, temperature=0)
         for i in range(12)])), purpose="batch")
    running = client.batches.create(input_file_id=slow.id, endpoint=CHAT, completion_window="1h")
    deadline = time.monotonic() + 30
    while client.batches.retrieve(running.id).status == "validating":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert client.batches.cancel(running.id).status in ("cancelling", "cancelled")
    cancelled = wait_batch(client, running.id)
    assert cancelled.status == "cancelled"
    assert cancelled.request_counts.completed < 12
    first = client.batches.list(limit=1)
    assert [b.id for b in first.data] == [running.id] and first.has_more
    second = client.batches.list(limit=1, after=running.id)
    assert [b.id for b in second.data] == [failed.id] and not second.has_more
    assert [b.id for b in client.batches.list()] == [running.id, failed.id]  # auto-paging
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(failed.id)


def test_upload_caps_and_purpose(bare):
    client = sdk(bare, bare.new_key())
    s = bare.settings
    with pytest.raises(openai.APIStatusError) as err:
        client.files.create(file=("many.jsonl", b"{}\n" * (s.api_max_upload_lines + 1)),
                            purpose="batch")
    assert err.value.status_code == 413 and err.value.code == "too_many_lines"
    with pytest.raises(openai.APIStatusError) as err:
        client.files.create(file=("wide.jsonl", b"{}\n" + b"x" * (s.api_max_line_bytes + 1)),
                            purpose="batch")
    assert err.value.status_code == 413 and "line 2" in err.value.message
    with pytest.raises(openai.APIStatusError) as err:
        client.files.create(file=("big.jsonl", b"{}\n" * (s.api_max_upload_bytes // 3 + 10)),
                            purpose="batch")
    assert err.value.status_code == 413 and "INFLIGHT_API_MAX_UPLOAD_BYTES" in err.value.message
    with pytest.raises(openai.BadRequestError) as err:
        client.files.create(file=("x.jsonl", b"{}\n"), purpose="fine-tune")
    assert err.value.param == "purpose"
    with pytest.raises(openai.BadRequestError):
        client.files.create(file=("empty.jsonl", b""), purpose="batch")
    assert client.files.list().data == []  # nothing half-stored stayed behind
    ok = client.files.create(file=("ok.jsonl", b"{}\n" * s.api_max_upload_lines), purpose="batch")
    assert [f.id for f in client.files.list().data] == [ok.id]
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id=f"file-{uuid.uuid4().hex}", endpoint=CHAT,
                              completion_window="24h")
