"""Parquet in and out through the whole path (the stack: Celery jobs worker, worker,
recorder, SQLite and Postgres): a table with an id column becomes a batch
(Client.create_batch, prompt column through a template after a system message), and its
results come back as Parquet with every input row once, the input columns carried
through, plus the response columns; over HTTP with ?format=parquet too."""

from __future__ import annotations

import io

import pytest

from tests.api.test_batches import CHAT, jsonl, line, wait_batch
from tests.api.test_chat import sdk

pytestmark = [pytest.mark.broker]

ROWS = 30


def test_parquet_table_round_trip(stack, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from inflight.producers.batch_lines import request_id_for
    from inflight.producers.batch_parquet import write_results
    from inflight.producers.client import Client

    src = tmp_path / "table.parquet"
    table = pa.table({"id": pa.array([1000 + i for i in range(ROWS)], pa.int64()),
                      "text": [f"red green {i}" for i in range(ROWS)],
                      "score": pa.array([i / 10 for i in range(ROWS)], pa.float64())})
    pq.write_table(table, src, row_group_size=8)
    with Client(stack.settings) as client:
        # the `id` column is taken as custom_id without being named
        b = client.create_batch(src, endpoint=CHAT, prompt_column="text",
                                system="Be brief.", template="Say: {text}", max_tokens=3)
        assert b.parquet_source["id_column"] == "id"
        done = client.wait_batch(b.id, timeout=120)
        assert done.status == "completed" and done.request_completed == ROWS
        row = client.store.get_request(request_id_for(b.id, "1003"))
        assert row.prompt == [{"role": "system", "content": "Be brief."},
                              {"role": "user", "content": "Say: red green 3"}]
        out = tmp_path / "out.parquet"
        assert write_results(client.store, done, out) == ROWS
        got = pq.read_table(out)
        assert got.column_names == ["id", "text", "score", "status", "response_text",
                                    "finish_reason", "prompt_tokens", "completion_tokens",
                                    "error"]
        pf = pq.ParquetFile(out)
        assert pf.metadata.num_row_groups >= 1
        rows = got.to_pylist()
        assert sorted(r["id"] for r in rows) == [1000 + i for i in range(ROWS)]
        for r in rows:
            stored = client.store.get_request(request_id_for(b.id, str(r["id"])))
            assert r["status"] == "completed" and r["error"] is None
            assert r["completion_tokens"] == stored.usage["completion_tokens"] <= 3
            assert r["score"] == (r["id"] - 1000) / 10


def test_results_as_parquet_over_http(stack):
    import pyarrow.parquet as pq

    key = stack.new_key()
    client = sdk(stack, key)
    upload = client.files.create(file=("p.jsonl", jsonl(
        [line(f"c{i}", "red green", max_tokens=2, temperature=0) for i in range(3)])),
        purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint=CHAT,
                                  completion_window="24h")
    assert wait_batch(client, batch.id).status == "completed"
    r = stack.http(key).get(f"/v1/batches/{batch.id}/results", params={"format": "parquet"})
    assert r.status_code == 200, r.text
    got = pq.read_table(io.BytesIO(r.content)).to_pylist()
    assert sorted(x["custom_id"] for x in got) == ["c0", "c1", "c2"]
    assert {x["status"] for x in got} == {"completed"}
    assert all(isinstance(x["text"], str) for x in got)
    # the finished lines as JSONL, resumable
    page = stack.http(key).get(f"/v1/batches/{batch.id}/results")
    assert page.status_code == 200 and len(page.text.splitlines()) == 3
    again = stack.http(key).get(f"/v1/batches/{batch.id}/results",
                                params={"after": page.headers["x-next-after"]})
    assert again.text == "" and again.headers["x-has-more"] == "false"
