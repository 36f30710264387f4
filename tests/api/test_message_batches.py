"""Anthropic Message Batches through the API, driven by the official anthropic SDK."""

from __future__ import annotations

import time

import anthropic
import pytest

from tests.api.test_batches import engine_reference
from tests.tiny_llama import SENTENCES

pytestmark = [pytest.mark.broker]


def sdk(stack, key) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=stack.url, api_key=key.token, max_retries=0, timeout=60)


def wait_ended(client: anthropic.Anthropic, batch_id: str, timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    while True:
        b = client.messages.batches.retrieve(batch_id)
        if b.processing_status == "ended":
            return b
        assert time.monotonic() < deadline, f"batch still {b.processing_status}"
        time.sleep(0.2)


def request(cid: str, text: str, max_tokens: int) -> dict:
    return {"custom_id": cid, "params": {"model": "tiny", "max_tokens": max_tokens,
                                         "temperature": 0.0,
                                         "messages": [{"role": "user", "content": text}]}}


def test_a_message_batch_with_the_anthropic_sdk(stack):
    key = stack.new_key()
    client = sdk(stack, key)
    words = " ".join(SENTENCES).split()
    items = [(f"m{i}", " ".join(words[2 * i:2 * i + 4]), 2 + i) for i in range(4)]
    made = client.messages.batches.create(requests=[request(*it) for it in items])
    assert made.id.startswith("msgbatch_") and made.processing_status == "in_progress"
    done = wait_ended(client, made.id)
    assert done.request_counts.succeeded == len(items) and done.results_url
    ref = engine_reference(stack.model, items)
    results = {r.custom_id: r.result for r in client.messages.batches.results(made.id)}
    assert sorted(results) == sorted(ref)
    for cid, result in results.items():
        assert result.type == "succeeded"
        assert result.message.content[0].text == ref[cid].text
        assert result.message.usage.output_tokens == len(ref[cid].token_ids)
    listed = client.messages.batches.list(limit=10)
    assert [b.id for b in listed.data] == [made.id] and not listed.has_more
    # an OpenAI batch id is not a message batch, and another key sees nothing
    other = sdk(stack, stack.new_key("other"))
    with pytest.raises(anthropic.NotFoundError):
        other.messages.batches.retrieve(made.id)
    assert list(other.messages.batches.list()) == []


def test_cancel_and_bad_input(stack):
    client = sdk(stack, stack.new_key())
    slow = client.messages.batches.create(requests=[
        {"custom_id": f"s{i}", "params": {"model": "tiny", "max_tokens": 480,
                                          "messages": [{"role": "user", "content": "hello"}]}}
        for i in range(10)])
    deadline = time.monotonic() + 30
    while client.messages.batches.retrieve(slow.id).request_counts.processing == 0:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert client.messages.batches.cancel(slow.id).processing_status in ("canceling", "ended")
    ended = wait_ended(client, slow.id)
    kinds = {r.result.type for r in client.messages.batches.results(slow.id)}
    assert ended.request_counts.canceled >= 1 and "canceled" in kinds
    with pytest.raises(anthropic.BadRequestError):
        client.messages.batches.create(requests=[])
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.batches.create(requests=[{"custom_id": "x"}])
    assert "custom_id" in err.value.message
