"""Parquet in and out of batch jobs (pyarrow, the `jobs` extra).

In: a table with a prompt column becomes OpenAI batch lines, one per row, read a row group
at a time (`table_lines`): `custom_id` is the row's `id_column` value (default: a column
named `custom_id` or `id`, else `row-<n>`); the prompt is the column's text, put through
`template` (`{text}` is replaced by it) and, for chat, after an optional `system` message;
`max_tokens` defaults to DEFAULT_MAX_TOKENS. The table itself is kept as the batch's source
file (purpose `batch_source`), so the results can carry every input column through.

Out (`write_results`): the input table's columns plus the response columns below, written
one row group per input row group (memory bounded by a row group, never the table):

    status (completed | failed | cancelled | expired | pending), text, finish_reason,
    prompt_tokens, completion_tokens, error

plus `embedding` (list<float32>) for a batch of /v1/embeddings (named `response_<name>`
where the input has a column of that name, e.g. `response_text` beside a prompt column
called `text`).

A batch made from JSONL gets `custom_id` plus the same response columns.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, BinaryIO

import orjson

from inflight.schemas.batch import CHAT_URL, COMPLETIONS_URL
from inflight.schemas.errors import SchemaError, require_extra
from inflight.store import BatchRow, Store
from inflight.store.models import CANCELLED, COMPLETED, EXPIRED

from inflight.producers.batch_lines import request_id_for

EMBEDDINGS_URL = "/v1/embeddings"
DEFAULT_MAX_TOKENS = 256     # chat / completions lines without max_tokens given
ID_COLUMNS = ("custom_id", "id")   # taken as the id column when none is named
ROWS_PER_GROUP = 10_000      # rows read and written at once (a row group of the output)
SOURCE_PURPOSE = "batch_source"
RESULT_COLUMNS = ("status", "text", "finish_reason", "prompt_tokens", "completion_tokens",
                  "error")


def _pq() -> Any:
    require_extra("jobs", "Parquet batches", "pyarrow")
    import pyarrow.parquet as pq

    return pq


def is_parquet(source: Any) -> bool:
    return isinstance(source, (str, Path)) and str(source).lower().endswith(".parquet")


def table_lines(source: str | Path | BinaryIO, *, endpoint: str, prompt_column: str,
                id_column: str | None = None, system: str | None = None,
                template: str | None = None, max_tokens: int | None = None,
                model: str | None = None) -> Iterator[bytes]:
    """OpenAI batch lines (JSONL bytes, one per row) from a Parquet table."""
    pq = _pq()
    pf = pq.ParquetFile(source)
    names = pf.schema_arrow.names
    id_column = id_column or default_id_column(names)
    if max_tokens is None and endpoint != EMBEDDINGS_URL:
        max_tokens = DEFAULT_MAX_TOKENS
    for flag, col in (("--prompt-column", prompt_column), ("--id-column", id_column)):
        if col is not None and col not in names:
            raise SchemaError(f"{flag} {col!r}: the table has no such column; its columns: "
                              f"{', '.join(names[:50])}", field=flag.lstrip("-"))
    if endpoint not in (CHAT_URL, COMPLETIONS_URL, EMBEDDINGS_URL):
        raise SchemaError(f"endpoint {endpoint!r}: a Parquet batch runs on {CHAT_URL}, "
                          f"{COMPLETIONS_URL} or {EMBEDDINGS_URL}", field="endpoint")
    if template is not None and "{text}" not in template:
        raise SchemaError("--template: put {text} where the prompt column's text goes",
                          field="template")
    cols = [prompt_column] + ([id_column] if id_column and id_column != prompt_column else [])
    row = 0
    for rb in pf.iter_batches(batch_size=ROWS_PER_GROUP, columns=cols):
        texts = rb.column(prompt_column).to_pylist()
        ids = rb.column(id_column).to_pylist() if id_column else None
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise SchemaError(f"row {row + i}: {prompt_column} is {type(text).__name__}, "
                                  "not text", field="prompt_column")
            prompt = template.replace("{text}", text) if template is not None else text
            cid = str(ids[i]) if ids is not None else f"row-{row + i}"
            yield orjson.dumps({"custom_id": cid, "method": "POST", "url": endpoint,
                                "body": _body(endpoint, prompt, system, max_tokens, model)}) + b"\n"
        row += len(texts)


def default_id_column(names: list[str]) -> str | None:
    """The table's `custom_id` or `id` column, carried through as custom_id."""
    return next((c for c in ID_COLUMNS if c in names), None)


def _body(endpoint: str, prompt: str, system: str | None, max_tokens: int | None,
          model: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {} if model is None else {"model": model}
    if endpoint == EMBEDDINGS_URL:
        body["input"] = prompt
        return body
    if endpoint == CHAT_URL:
        body["messages"] = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt if not system else f"{system}\n\n{prompt}"
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


# -- results --------------------------------------------------------------------------------------

def write_results(store: Store, batch: BatchRow, sink: str | Path | IO[bytes]) -> int:
    """Write the batch's results as Parquet to `sink` (a path or a binary file); returns the
    number of rows. Works while the batch runs too (unfinished rows: status `pending`)."""
    pq = _pq()
    import pyarrow as pa

    writer = None
    rows = 0
    try:
        for table in _result_groups(store, batch, pa):
            if writer is None:
                writer = pq.ParquetWriter(sink, table.schema)
            writer.write_table(table)
            rows += table.num_rows
        if writer is None:  # no rows at all: an empty table with the response columns
            writer = pq.ParquetWriter(sink, _response_schema(pa, pa.schema([("custom_id", pa.string())])))
            writer.write_table(pa.Table.from_pylist([], schema=writer.schema))
    finally:
        if writer is not None:
            writer.close()
    return rows


_TYPES = {"status": "string", "text": "string", "finish_reason": "string",
          "prompt_tokens": "int64", "completion_tokens": "int64", "error": "string"}


def response_name(column: str, input_names: Any) -> str:
    """A response column's name: `response_<name>` where the input has a column so named
    (a prompt column called `text`)."""
    return f"response_{column}" if column in input_names else column


def _response_schema(pa: Any, base: Any) -> Any:
    names = set(base.names)
    return pa.schema(list(base) + [pa.field(response_name(c, names), getattr(pa, _TYPES[c])())
                                   for c in RESULT_COLUMNS])


def _result_groups(store: Store, batch: BatchRow, pa: Any) -> Iterator[Any]:
    src = batch.parquet_source or {}
    if src.get("file_id"):
        yield from _from_source(store, batch, src, pa)
        return
    from inflight.producers.batch_output import _pages

    for page in _pages(store, batch):
        cids = [p[0] for p in page]
        base = pa.table({"custom_id": pa.array(cids, pa.string())})
        yield _with_responses(store, batch, base, cids, pa)


def _from_source(store: Store, batch: BatchRow, src: dict[str, Any], pa: Any) -> Iterator[Any]:
    """The stored source table, spooled to a temporary file (Parquet needs to seek), read a
    row group at a time."""
    pq = _pq()
    with tempfile.TemporaryFile(prefix="inflight-src-") as tmp:
        for piece in store.iter_file(src["file_id"]):
            tmp.write(piece)
        tmp.seek(0)
        pf = pq.ParquetFile(tmp)
        id_column = src.get("id_column")
        row = 0
        for rb in pf.iter_batches(batch_size=ROWS_PER_GROUP):
            n = rb.num_rows
            cids = ([str(v) for v in rb.column(id_column).to_pylist()] if id_column
                    else [f"row-{row + i}" for i in range(n)])
            row += n
            yield _with_responses(store, batch, pa.Table.from_batches([rb]), cids, pa)


def _with_responses(store: Store, batch: BatchRow, base: Any, cids: list[str], pa: Any) -> Any:
    rids = [request_id_for(batch.id, c) for c in cids]
    found = store.result_rows(rids)
    out: dict[str, list[Any]] = {c: [] for c in RESULT_COLUMNS}
    for rid in rids:
        r = found.get(rid)
        status = r["status"] if r is not None else None
        if status not in (COMPLETED, "failed", CANCELLED, EXPIRED):
            status = ((EXPIRED if batch.status == EXPIRED else CANCELLED)
                      if batch.is_final else "pending")
        usage = (r or {}).get("usage") or {}
        out["status"].append(status)
        out["text"].append((r or {}).get("output") if status == COMPLETED else None)
        out["finish_reason"].append((r or {}).get("finish_reason") if r else None)
        out["prompt_tokens"].append(usage.get("prompt_tokens"))
        out["completion_tokens"].append(usage.get("completion_tokens"))
        out["error"].append(None if status in (COMPLETED, "pending")
                            else ((r or {}).get("error") or status))
    schema = _response_schema(pa, base.schema)
    arrays = list(base.columns) + [pa.array(out[c], getattr(pa, _TYPES[c])())
                                   for c in RESULT_COLUMNS]
    if batch.endpoint == EMBEDDINGS_URL:  # the vector, as list<float32>
        from inflight.schemas.embeddings import unpack_vector

        vectors = [unpack_vector(found[rid]["embedding"])
                   if rid in found and found[rid].get("embedding") else None for rid in rids]
        name = response_name("embedding", set(base.schema.names))
        schema = schema.append(pa.field(name, pa.list_(pa.float32())))
        arrays.append(pa.array(vectors, pa.list_(pa.float32())))
    return pa.Table.from_arrays(arrays, schema=schema)
