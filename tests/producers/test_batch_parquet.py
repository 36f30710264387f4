"""Parquet tables into batch lines (producers.batch_parquet.table_lines): one line per row,
read a row group at a time, the id column carried through as custom_id, template and
system message applied; clear errors for a missing column or a non-text prompt. The whole
path (jobs worker, results as Parquet): tests/api/test_parquet_batches.py."""

from __future__ import annotations

import orjson
import pytest

from inflight.producers.batch_parquet import response_name, table_lines
from inflight.schemas.errors import SchemaError

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def write(tmp_path, name="t.parquet", **cols):
    path = tmp_path / name
    pq.write_table(pa.table(cols), path, row_group_size=3)
    return path


def test_rows_become_chat_lines(tmp_path):
    path = write(tmp_path, id=["a", "b", "c", "d", "e"], text=["one", "two", "three", "four", "five"])
    lines = [orjson.loads(x) for x in table_lines(
        path, endpoint="/v1/chat/completions", prompt_column="text", id_column="id",
        system="Be brief.", template="Summarize: {text}", max_tokens=7)]
    assert [x["custom_id"] for x in lines] == ["a", "b", "c", "d", "e"]
    assert lines[3] == {"custom_id": "d", "method": "POST", "url": "/v1/chat/completions",
                        "body": {"messages": [{"role": "system", "content": "Be brief."},
                                              {"role": "user", "content": "Summarize: four"}],
                                 "max_tokens": 7}}
    plain = [orjson.loads(x) for x in table_lines(path, endpoint="/v1/completions",
                                                  prompt_column="text", max_tokens=2)]
    assert plain[0]["custom_id"] == "a" and plain[4]["body"] == {"prompt": "five",
                                                                  "max_tokens": 2}
    anon = write(tmp_path, "anon.parquet", text=["x", "y"])          # no id column: row numbers
    rows = [orjson.loads(x) for x in table_lines(anon, endpoint="/v1/completions",
                                                 prompt_column="text")]
    assert [r["custom_id"] for r in rows] == ["row-0", "row-1"]
    assert rows[0]["body"]["max_tokens"] == 256        # the default
    emb = [orjson.loads(x) for x in table_lines(path, endpoint="/v1/embeddings",
                                                prompt_column="text")]
    assert emb[1]["body"] == {"input": "two"}


def test_bad_tables_say_what_to_fix(tmp_path):
    path = write(tmp_path, id=[1, 2], text=["x", None])
    with pytest.raises(SchemaError, match="the table has no such column; its columns: id, text"):
        list(table_lines(path, endpoint="/v1/completions", prompt_column="body"))
    with pytest.raises(SchemaError, match="row 1: text is NoneType"):
        list(table_lines(path, endpoint="/v1/completions", prompt_column="text"))
    with pytest.raises(SchemaError, match=r"\{text\}"):
        list(table_lines(path, endpoint="/v1/completions", prompt_column="text",
                         template="no placeholder"))
    assert response_name("text", {"text"}) == "response_text"
    assert response_name("error", {"text"}) == "error"


def test_results_carry_input_columns_and_vectors(db_url, tmp_path):
    """write_results on the store (SQLite and Postgres): an embeddings batch made from a
    table, two rows finished (one vector each), one still pending while the batch runs."""
    import struct

    from inflight.producers import batch_jobs as jobs
    from inflight.producers.batch_lines import request_id_for
    from inflight.producers.batch_parquet import write_results
    from inflight.store import Store

    path = write(tmp_path, key=["k1", "k2", "k3"], text=["a b", "c d", "e f"])
    store = Store(db_url, create=True)
    try:
        table = store.create_file(iter([path.read_bytes()]), purpose="batch_source",
                                  filename="t.parquet")
        f = store.create_file(table_lines(path, endpoint="/v1/embeddings", prompt_column="text",
                                          id_column="key"), purpose="batch", filename="t.jsonl")
        b = jobs.create_batch(store, input_file_id=f.id, endpoint="/v1/embeddings")
        store.set_batch_fields(b.id, parquet_source={"file_id": table.id, "id_column": "key",
                                                     "prompt_column": "text"})
        store.upsert_requests([{"id": request_id_for(b.id, k), "batch_id": b.id, "custom_id": k,
                                "status": "completed", "finish_reason": "stop",
                                "usage": {"prompt_tokens": 2, "completion_tokens": 0},
                                "embedding": struct.pack("<2f", i, -i)}
                               for i, k in ((1.0, "k1"), (2.0, "k3"))])
        out = tmp_path / "out.parquet"
        assert write_results(store, store.require_batch(b.id), out) == 3
        rows = {r["key"]: r for r in pq.read_table(out).to_pylist()}
        assert rows["k1"]["text"] == "a b" and rows["k1"]["embedding"] == [1.0, -1.0]
        assert rows["k3"]["embedding"] == [2.0, -2.0] and rows["k3"]["status"] == "completed"
        assert rows["k2"]["status"] == "pending" and rows["k2"]["embedding"] is None
        assert "response_text" in rows["k1"]
    finally:
        store.close()
