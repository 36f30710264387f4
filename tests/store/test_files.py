"""Files: streamed into chunks, read back in pieces and lines (SQLite + Postgres)."""

from __future__ import annotations

import hashlib

import pytest

from inflight.schemas import NotFoundError
from inflight.store import CHUNK_BYTES, Store


def test_round_trip_across_chunk_boundaries(store: Store):
    # lines of odd sizes so line breaks fall on both sides of each 1 MiB boundary
    lines = [(b"x" * (i * 7919 % 50_000)) + b"|%d" % i for i in range(200)]
    content = b"\n".join(lines)  # no trailing newline: the last line still counts
    pieces = [content[i:i + 333_333] for i in range(0, len(content), 333_333)]
    seen = []
    row = store.create_file(iter(pieces), purpose="batch", filename="in.jsonl", owner="me",
                            progress=seen.append)
    assert row.status == "uploaded" and row.bytes == len(content) and row.line_count == 200
    assert row.sha256 == hashlib.sha256(content).hexdigest() and row.owner == "me"
    assert sum(seen) == len(content) and max(seen) <= CHUNK_BYTES and len(seen) > 2
    chunks = list(store.iter_file(row.id))
    assert b"".join(chunks) == content and all(len(c) <= CHUNK_BYTES for c in chunks)
    assert [ln for _, ln in store.iter_file_lines(row.id)] == lines
    assert [n for n, _ in store.iter_file_lines(row.id, start=199)] == [199, 200]


@pytest.mark.parametrize("content,count", [(b"", 0), (b"a", 1), (b"a\n", 1), (b"a\n\nb\n", 3)])
def test_line_counts(store: Store, content: bytes, count: int):
    row = store.create_file([content], purpose="batch_output", filename="f")
    assert row.line_count == count
    assert len(list(store.iter_file_lines(row.id))) == count


def test_list_delete_and_errors(store: Store):
    a = store.create_file([b"1\n"], purpose="batch", filename="a", owner="o1")
    b = store.create_file([b"2\n"], purpose="batch_errors", filename="b", owner="o2")
    assert [f.id for f in store.list_files()] == [b.id, a.id]
    assert [f.id for f in store.list_files(owner="o1")] == [a.id]
    assert [f.id for f in store.list_files(purpose="batch_errors")] == [b.id]
    assert store.delete_file(a.id) and not store.delete_file(a.id)
    assert store.get_file(a.id) is None
    with pytest.raises(NotFoundError):
        list(store.iter_file(a.id))
    with pytest.raises(ValueError):
        store.create_file([b""], purpose="fine-tune", filename="x")


def test_reclaim_uploads_takes_only_abandoned_uploads(store: Store):
    """A writer that died leaves its file `uploading`; the sweep deletes it and its chunks
    after the grace period, never a finished file, never a younger upload. A writer the
    sweep outran fails saying so and leaves nothing behind."""
    from sqlalchemy import func, select

    from inflight.schemas.errors import StoreError
    from inflight.store.models import FileChunkRow, FileRow

    kept = store.create_file([b"done\n"], purpose="batch", filename="kept")
    seen: list[list[str]] = []

    def dying_writer():
        yield b"x" * CHUNK_BYTES  # stored: one chunk
        assert store.reclaim_uploads(3600) == []  # young: not taken
        seen.append(store.reclaim_uploads(0))  # past the grace period (0 s): taken
        yield b"tail\n"

    with pytest.raises(StoreError, match="INFLIGHT_API_UPLOAD_GRACE_S"):
        store.create_file(dying_writer(), purpose="batch", filename="slow")
    assert len(seen[0]) == 1 and seen[0][0] != kept.id
    with store.session() as s:
        assert s.scalars(select(FileRow.id)).all() == [kept.id]
        assert s.scalar(select(func.count()).select_from(FileChunkRow)) == 1  # kept's own
    assert store.reclaim_uploads(0) == [] and store.get_file(kept.id) is not None
