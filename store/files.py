"""Files (OpenAI File objects): content streamed into `file_chunks`, never held whole.

    row = store.create_file(chunks, purpose="batch", filename="in.jsonl")   # any byte pieces
    for line_no, line in store.iter_file_lines(row.id): ...                 # 1-based, no "\\n"

NOTE: content lives in the database, not in a data directory, so every process that
reaches the database (a Celery worker on another host, the HTTP API, the CLI) reaches the
bytes too. Each chunk is written in its own short transaction (an upload never holds a
long write lock on SQLite); the row is `uploading` until the last chunk is in, then
`uploaded` with its size, line count and sha256. Readers see only `uploaded` files.
A file still `uploading` long after it began was left by a writer that died (kill -9 of
the API mid-write): `reclaim_uploads` deletes it with its chunks (the API's sweep).
With INFLIGHT_FILES_URL the content is an object instead (store.object_files); the row
keeps its location. (A dead writer's unfinished multipart upload is left to the bucket's
lifecycle rule for incomplete uploads.)
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, select, tuple_, update

from inflight.schemas.errors import NotFoundError, StoreError
from inflight.store.models import (BATCH_FINAL_STATUSES, FILE_UPLOADED, FILE_UPLOADING, BatchRow,
                                   FileChunkRow, FileRow, utcnow)

CHUNK_BYTES = 1 << 20  # 1 MiB per stored chunk

# batch_source: the Parquet table a batch was made from (its results carry its columns)
FILE_PURPOSES = ("batch", "batch_output", "batch_errors", "batch_source")


def new_file_id() -> str:
    return "file-" + uuid.uuid4().hex


def _reclaimed(file_id: str) -> StoreError:
    return StoreError(f"the upload of {file_id} ran past the grace period of abandoned uploads "
                      "(INFLIGHT_API_UPLOAD_GRACE_S) and was reclaimed; upload the file again, "
                      "or raise that setting")


class FileQueries:
    """Mixed into store.Store (which provides session())."""

    def create_file(self, content: Iterable[bytes], *, purpose: str, filename: str,
                    owner: str | None = None, expires_at: datetime | None = None,
                    file_id: str | None = None,
                    progress: Callable[[int], None] | None = None) -> FileRow:
        """Store a file from byte pieces of any size (a file object read in blocks, a
        generator of output lines). `progress(n)` is called with each stored chunk's size."""
        if purpose not in FILE_PURPOSES:
            raise ValueError(f"file purpose {purpose!r}: use one of {FILE_PURPOSES}")
        fid = file_id or new_file_id()
        with self.session() as s:  # type: ignore[attr-defined]
            s.add(FileRow(id=fid, purpose=purpose, filename=filename[:512], status=FILE_UPLOADING,
                          bytes=0, line_count=0, owner=owner, created_at=utcnow(),
                          expires_at=expires_at))
        digest, size, newlines, last = hashlib.sha256(), 0, 0, b""
        seq = 0
        buf = bytearray()
        objects = getattr(self, "objects", None)
        writer = objects.writer(fid) if objects is not None else None
        location = None

        def flush(piece: bytes) -> None:
            nonlocal seq
            if writer is not None:
                writer.write(piece)   # parts of a multipart upload (store.object_files)
            else:
                with self.session() as s:  # type: ignore[attr-defined]
                    s.add(FileChunkRow(file_id=fid, seq=seq, data=piece))
            seq += 1
            if progress is not None:
                progress(len(piece))

        try:
            for part in content:
                if not part:
                    continue
                digest.update(part)
                size += len(part)
                newlines += part.count(b"\n")
                last = part[-1:]
                buf += part
                while len(buf) >= CHUNK_BYTES:
                    flush(bytes(buf[:CHUNK_BYTES]))
                    del buf[:CHUNK_BYTES]
            if buf:
                flush(bytes(buf))
            if writer is not None:
                location = writer.finish()
        except BaseException as exc:
            if writer is not None:
                writer.abort()
            # the source failed (a broken upload, a writer that lost its batch): no half file
            gone = isinstance(exc, StoreError) and not self._file_row(fid)
            self.delete_file(fid)
            if gone:  # a chunk for a row the sweep took (Postgres: the foreign key says so)
                raise _reclaimed(fid) from exc
            raise
        lines = newlines + (1 if size and last != b"\n" else 0)
        with self.session() as s:  # type: ignore[attr-defined]
            done = s.execute(update(FileRow).where(
                FileRow.id == fid, FileRow.status == FILE_UPLOADING).values(
                status=FILE_UPLOADED, bytes=size, line_count=lines, sha256=digest.hexdigest(),
                location=location))
        if done.rowcount != 1:  # the sweep took it for a dead writer's (reclaim_uploads)
            self.delete_file(fid)
            if location is not None:  # the row that named the object is gone
                self._objects().delete(location)
            raise _reclaimed(fid)
        row = self.get_file(fid, expired=True)
        if row is None:
            raise NotFoundError(f"file {fid!r} was deleted while it was being written")
        return row

    def _file_row(self, file_id: str) -> bool:
        with self.session() as s:  # type: ignore[attr-defined]
            return s.get(FileRow, file_id) is not None

    def reclaim_uploads(self, grace_s: float) -> list[str]:
        """Delete every file still `uploading` `grace_s` seconds after its upload began,
        with its chunks: what a writer killed mid-upload left (no reader ever sees it).
        Returns their ids. Safe beside live uploads younger than that, and in any number
        of processes at once."""
        cutoff = utcnow() - timedelta(seconds=grace_s)
        with self.session() as s:  # type: ignore[attr-defined]
            ids = list(s.scalars(select(FileRow.id).where(FileRow.status == FILE_UPLOADING,
                                                          FileRow.created_at < cutoff)))
        gone = []
        for fid in ids:  # one short transaction each: a big file never holds a long lock
            with self.session() as s:  # type: ignore[attr-defined]
                # NOTE: the row first, and only while still `uploading`: a writer that
                # finishes meanwhile keeps its file (its chunks are never taken from it)
                if s.execute(delete(FileRow).where(FileRow.id == fid,
                                                   FileRow.status == FILE_UPLOADING)).rowcount:
                    s.execute(delete(FileChunkRow).where(FileChunkRow.file_id == fid))
                    gone.append(fid)
        return gone

    def get_file(self, file_id: str, *, expired: bool = False) -> FileRow | None:
        """An uploaded file not past its expires_at (`expired`: even one past it; the sweep
        deletes them)."""
        with self.session() as s:  # type: ignore[attr-defined]
            row = s.get(FileRow, file_id)
            if row is None or row.status != FILE_UPLOADED:
                return None
            if not expired and row.expires_at is not None and row.expires_at <= utcnow():
                return None
            return row

    def delete_expired_files(self, limit: int = 1000) -> list[str]:
        """Delete files past their expires_at (`expires_after` of an upload, a batch's
        `output_expires_after`), each in its own transaction; their ids. The sweeps call it
        (the API's upload sweep, the jobs worker's batch sweep)."""
        with self.session() as s:  # type: ignore[attr-defined]
            ids = list(s.scalars(select(FileRow.id).where(FileRow.expires_at.is_not(None),
                                                          FileRow.expires_at <= utcnow())
                                 .limit(limit)))
        return [fid for fid in ids if self.delete_file(fid)]

    def require_file(self, file_id: str) -> FileRow:
        row = self.get_file(file_id)
        if row is None:
            raise NotFoundError(f"file {file_id!r} not found (or still uploading)")
        return row

    def list_files(self, *, owner: str | None = None, purpose: str | None = None,
                   limit: int = 100, after: str | None = None,
                   order: str = "desc") -> list[FileRow]:
        """Newest first (`order="asc"`: oldest first); page with `after=<last id of the
        previous page>` (OpenAI's cursor). An `after` that names no file starts from the
        first."""
        if order not in ("asc", "desc"):
            raise ValueError(f"order {order!r}: use 'asc' or 'desc'")
        q = select(FileRow).where(FileRow.status == FILE_UPLOADED)
        if owner is not None:
            q = q.where(FileRow.owner == owner)
        if purpose is not None:
            q = q.where(FileRow.purpose == purpose)
        key = tuple_(FileRow.created_at, FileRow.id)
        with self.session() as s:  # type: ignore[attr-defined]
            if after is not None:
                cursor = s.get(FileRow, after)
                if cursor is not None:
                    at = tuple_(cursor.created_at, cursor.id)
                    q = q.where(key < at if order == "desc" else key > at)
            by = ((FileRow.created_at.desc(), FileRow.id.desc()) if order == "desc"
                  else (FileRow.created_at.asc(), FileRow.id.asc()))
            return list(s.scalars(q.order_by(*by).limit(limit)).all())

    def iter_file(self, file_id: str) -> Iterator[bytes]:
        """The file's content, one stored chunk (<= CHUNK_BYTES) at a time (from object
        storage: the object's body, streamed)."""
        row = self.require_file(file_id)
        if row.location is not None:
            yield from self._objects().read(row.location)
            return
        seq = 0
        while True:
            with self.session() as s:  # type: ignore[attr-defined]
                data = s.scalar(select(FileChunkRow.data).where(
                    FileChunkRow.file_id == file_id, FileChunkRow.seq == seq))
            if data is None:
                return
            yield bytes(data)
            seq += 1

    def iter_file_lines(self, file_id: str, *, start: int = 1) -> Iterator[tuple[int, bytes]]:
        """(line number from 1, line without its newline), skipping lines before `start`.
        A last line without a newline is a line; a trailing newline adds none."""
        no, tail = 0, b""
        for chunk in self.iter_file(file_id):
            parts = (tail + chunk).split(b"\n")
            tail = parts.pop()
            for line in parts:
                no += 1
                if no >= start:
                    yield no, line
        if tail:
            no += 1
            if no >= start:
                yield no, tail

    def file_in_use(self, file_id: str) -> str | None:
        """The id of an open batch (not ended yet) that reads this file as its input, or
        None: its validation, enqueue and result writing all read the input again."""
        with self.session() as s:  # type: ignore[attr-defined]
            return s.scalar(select(BatchRow.id).where(
                BatchRow.input_file_id == file_id,
                BatchRow.status.not_in(sorted(BATCH_FINAL_STATUSES))).limit(1))

    def delete_file(self, file_id: str) -> bool:
        """Remove a file and its content; False if there was none."""
        with self.session() as s:  # type: ignore[attr-defined]
            location = s.scalar(select(FileRow.location).where(FileRow.id == file_id))
            s.execute(delete(FileChunkRow).where(FileChunkRow.file_id == file_id))
            gone = s.execute(delete(FileRow).where(FileRow.id == file_id)).rowcount == 1
        if location is not None:
            self._objects().delete(location)
        return gone

    def _objects(self) -> Any:
        """The object store of INFLIGHT_FILES_URL (or, for a file written while it was set,
        one reaching the file's bucket with the same endpoint)."""
        objects = getattr(self, "objects", None)
        if objects is None:
            from inflight.store.object_files import ObjectFiles

            objects = self.objects = ObjectFiles(  # type: ignore[attr-defined]
                "s3://_/", endpoint=getattr(self, "files_endpoint", None))
        return objects
