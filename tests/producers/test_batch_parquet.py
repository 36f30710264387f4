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


def write(tmp_path, **cols):
    path = tmp_path / "t.parquet"
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
    assert plain[0]["custom_id"] == "row-0" and plain[4]["body"] == {"prompt": "five",
                                                                      "max_tokens": 2}
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
