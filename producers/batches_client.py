"""Batch jobs from Python: files into the store, batches handed to the Celery workers of
`inflight jobs` (producers/batch_jobs.py has the lifecycle), their results read back.

    batches = BatchesClient(settings, open_store, publisher)
    b = batches.create_batch("in.jsonl", endpoint="/v1/chat/completions", completion_window="24h")
    batches.get_batch(b.id).status        # validating -> in_progress -> finalizing -> completed
    batches.cancel_batch(b.id); batches.list_batches(); batches.wait_batch(b.id, timeout=...)
    for line in batches.batch_results(b.id): ...          # output lines (dicts), input order
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import orjson

from inflight.schemas import SchemaError, Settings
from inflight.schemas.errors import StateError, needs_extra
from inflight.store import BatchRow, FileRow, Store

# NOTE: batch jobs (producers.batch_jobs) and Celery (producers.celery_app, the `jobs`
# extra) load at the first batch call: a pipeline that submits and polls never imports them
if TYPE_CHECKING:
    from celery import Celery

    from inflight.producers.batch_context import RequestPublisher


class BatchesClient:
    """Files and batch jobs. `store`: opens (or hands back) the client's store;
    `publisher`: sends a batch's cancel (the requests side of the client)."""

    def __init__(self, settings: Settings, store: Callable[[], Store],
                 publisher: RequestPublisher):
        self.settings = settings
        self._open_store = store
        self.publisher = publisher
        self._celery: Celery | None = None

    @property
    def store(self) -> Store:
        return self._open_store()

    @property
    def celery(self) -> Celery:
        """The Celery app batch tasks are sent with (MissingExtraError without `jobs`)."""
        if self._celery is None:
            with needs_extra("jobs", "sending batch jobs (Client.create_batch)"):
                from inflight.producers.celery_app import celery_app

                self._celery = celery_app(self.settings)
        return self._celery

    def close(self) -> None:
        if self._celery is not None:
            self._celery.close()
            self._celery = None

    def upload_file(self, source: str | Path | bytes | BinaryIO, *, purpose: str = "batch",
                    filename: str | None = None, owner: str | None = None,
                    progress: bool = False) -> FileRow:
        """Store a file (a path, bytes or a binary file object), streamed in 1 MiB pieces."""
        from tqdm import tqdm

        if isinstance(source, (str, Path)):
            path = Path(source)
            try:
                fh: BinaryIO = open(path, "rb")
            except OSError as exc:
                raise SchemaError(f"cannot read {path}: {exc.strerror}") from None
            name, total = filename or path.name, path.stat().st_size
        elif isinstance(source, (bytes, bytearray)):
            fh, name, total = io.BytesIO(source), filename or "input.jsonl", len(source)
        else:
            fh, name, total = source, filename or getattr(source, "name", "input.jsonl"), None
        with fh, tqdm(total=total, unit="B", unit_scale=True, desc="upload",
                      disable=not progress) as bar:
            return self.store.create_file(iter(lambda: fh.read(1 << 20), b""), purpose=purpose,
                                          filename=str(name), owner=owner, progress=bar.update)

    def create_batch(self, source: str | Path | bytes | BinaryIO | None = None, *,
                     input_file_id: str | None = None,
                     endpoint: str = "/v1/chat/completions", completion_window: str = "24h",
                     metadata: Mapping[str, str] | None = None, owner: str | None = None,
                     progress: bool = False,
                     output_expires_after: Mapping[str, Any] | None = None,
                     prompt_column: str | None = None, id_column: str | None = None,
                     system: str | None = None, template: str | None = None,
                     max_tokens: int | None = None, model: str | None = None) -> BatchRow:
        """Upload `source` (or use an uploaded `input_file_id`), create a `validating`
        batch and hand it to the Celery workers (`inflight jobs`) to validate and enqueue.
        `output_expires_after`: `{"anchor": "created_at", "seconds": N}` for its output
        files. A Parquet table (a `.parquet` path, or `prompt_column` given): one request per
        row from `prompt_column` (through `template`, after `system`; `max_tokens` and
        `model` on every line), `custom_id` from `id_column` (producers.batch_parquet)."""
        if (source is None) == (input_file_id is None):
            raise SchemaError("create_batch: give a file to upload or an input_file_id (one)")
        app = self.celery  # first: no file is stored for a batch that cannot start (no `jobs`)
        from inflight.producers import batch_jobs, batch_parquet
        from inflight.producers.celery_app import send_enqueue

        parquet = None
        if input_file_id is None and (prompt_column is not None or batch_parquet.is_parquet(source)):
            if prompt_column is None:
                raise SchemaError("a Parquet table needs prompt_column (--prompt-column): the "
                                  "column whose text is each row's prompt")
            parquet = self._upload_table(source, endpoint=endpoint, owner=owner,  # type: ignore[arg-type]
                                         prompt_column=prompt_column, id_column=id_column,
                                         system=system, template=template,
                                         max_tokens=max_tokens, model=model)
            input_file_id = parquet.pop("input_file_id")
        if input_file_id is None:
            input_file_id = self.upload_file(source, owner=owner, progress=progress).id  # type: ignore[arg-type]
        b = batch_jobs.create_batch(self.store, input_file_id=input_file_id, endpoint=endpoint,
                                    completion_window=completion_window,
                                    metadata=dict(metadata) if metadata else None, owner=owner,
                                    output_expires_after=dict(output_expires_after)
                                    if output_expires_after else None)
        if parquet is not None:
            self.store.set_batch_fields(b.id, parquet_source=parquet)
            b = self.store.require_batch(b.id)
        send_enqueue(app, b.id)
        return b

    def _upload_table(self, source: str | Path | bytes | BinaryIO, *, endpoint: str,
                      owner: str | None, **how: Any) -> dict[str, Any]:
        """Store the table (purpose batch_source) and its JSONL lines (the batch input)."""
        from inflight.producers import batch_parquet

        if isinstance(source, (bytes, bytearray)):
            source = io.BytesIO(source)
        table = self.upload_file(source, purpose=batch_parquet.SOURCE_PURPOSE, owner=owner,
                                 filename=None if not isinstance(source, io.BytesIO)
                                 else "table.parquet")
        if not isinstance(source, (str, Path)):
            source.seek(0)
        name = Path(table.filename).stem + ".jsonl"
        lines = batch_parquet.table_lines(source, endpoint=endpoint, **how)
        try:
            f = self.store.create_file(lines, purpose="batch", filename=name, owner=owner)
        except BaseException:
            self.store.delete_file(table.id)
            raise
        id_column = how["id_column"]
        if id_column is None:  # the one table_lines took (a `custom_id` or `id` column)
            import pyarrow.parquet as pq

            if not isinstance(source, (str, Path)):
                source.seek(0)
            id_column = batch_parquet.default_id_column(pq.ParquetFile(source).schema_arrow.names)
        return {"input_file_id": f.id, "file_id": table.id,
                "prompt_column": how["prompt_column"], "id_column": id_column}

    def get_batch(self, batch_id: str) -> BatchRow:
        """The batch row (NotFoundError for an unknown id), its request counts counted now
        while it runs; batch_jobs.batch_object(row) gives the OpenAI JSON."""
        from inflight.producers.batch_jobs import live_counts

        return live_counts(self.store, self.store.require_batch(batch_id))

    def list_batches(self, *, limit: int = 20, after: str | None = None,
                     owner: str | None = None) -> list[BatchRow]:
        return self.store.list_batches(limit=limit, after=after, owner=owner)

    def cancel_batch(self, batch_id: str) -> BatchRow:
        from inflight.producers import batch_jobs

        return batch_jobs.cancel_batch(self.store, self.publisher, batch_id)

    def wait_batch(self, batch_id: str, timeout: float | None = None,
                   poll_s: float = 0.5) -> BatchRow:
        """Poll until the batch is completed/failed/expired/cancelled or `timeout` passes."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            b = self.get_batch(batch_id)
            if b.is_final or (deadline is not None and time.monotonic() >= deadline):
                return b
            time.sleep(poll_s)

    def batch_file_lines(self, batch_id: str, *, errors: bool = False) -> Iterator[bytes]:
        """Raw lines of the batch's output file (or error file); none while it has none.
        StateError while the batch has not ended."""
        b = self.get_batch(batch_id)
        if not b.is_final:
            raise StateError(f"batch {batch_id} is {b.status}; results exist once it is "
                             "completed, expired or cancelled")
        fid = b.error_file_id if errors else b.output_file_id
        if fid is None:
            return
        for _, line in self.store.iter_file_lines(fid):
            yield line

    def batch_results(self, batch_id: str, *, errors: bool = False) -> Iterator[dict[str, Any]]:
        """The output (or error) lines of an ended batch as dicts, in input order."""
        for line in self.batch_file_lines(batch_id, errors=errors):
            yield orjson.loads(line)
