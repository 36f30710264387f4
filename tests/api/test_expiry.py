"""Expiry as the openai SDK sends it: `expires_after` on an upload and
`output_expires_after` on a batch (anchor created_at, seconds) are honoured, `expires_at`
reported, and expired files are gone (404 at once, deleted by the jobs worker's sweep)."""

from __future__ import annotations

import time

import openai
import pytest

from tests.api.test_batches import CHAT, jsonl, line, wait_batch
from tests.api.test_chat import sdk

pytestmark = [pytest.mark.broker]


def test_file_and_batch_output_expiry_with_the_openai_sdk(stack):
    client = sdk(stack, stack.new_key())
    data = jsonl([line("a", "red green", max_tokens=2, temperature=0)])
    kept = client.files.create(file=("k.jsonl", data), purpose="batch",
                               expires_after={"anchor": "created_at", "seconds": 3600})
    assert kept.expires_at == kept.created_at + 3600
    assert client.files.retrieve(kept.id).expires_at == kept.expires_at
    with pytest.raises(openai.BadRequestError) as info:
        client.files.create(file=("k.jsonl", data), purpose="batch",
                            expires_after={"anchor": "last_active_at", "seconds": 60})
    assert "expires_after" in str(info.value)
    batch = client.batches.create(input_file_id=kept.id, endpoint=CHAT, completion_window="24h",
                                  output_expires_after={"anchor": "created_at", "seconds": 4})
    done = wait_batch(client, batch.id)
    assert done.status == "completed"
    out = client.files.retrieve(done.output_file_id)
    assert out.expires_at == done.created_at + 4
    deadline = time.monotonic() + 30
    while stack.store._file_row(done.output_file_id):     # the sweep deletes it
        assert time.monotonic() < deadline, "the expired output file was not deleted"
        time.sleep(0.2)
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(done.output_file_id)
    assert client.files.retrieve(kept.id).id == kept.id   # the input has an hour left
