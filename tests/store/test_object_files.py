"""File content on object storage (INFLIGHT_FILES_URL=s3://..., store.object_files) against
moto's S3 server: multipart upload in parts, streamed reads equal to what was written,
lines, delete and expiry remove the object, a failed upload leaves nothing; rows on
SQLite and Postgres. The batch functions on S3 files: tests/producers/test_batch_jobs.py."""

from __future__ import annotations

import hashlib
from datetime import timedelta

import pytest

from inflight.store import Store
from inflight.store.models import utcnow
from inflight.store.object_files import PART_BYTES, split_s3
from tests.store.local_s3 import local_s3, s3_url  # noqa: F401 - the fixture


def objects(s3) -> set[str]:
    import boto3

    client = boto3.client("s3", endpoint_url=s3.endpoint)
    return {o["Key"] for o in client.list_objects_v2(Bucket=s3.bucket).get("Contents", [])}


def test_files_live_in_the_bucket(db_url, local_s3):  # noqa: F811
    store = Store(db_url, create=True, files_url=s3_url(local_s3), files_endpoint=local_s3.endpoint)
    try:
        piece = b"".join(b'{"n": %d, "pad": "%s"}\n' % (i, b"x" * 200) for i in range(4000))
        pieces = [piece] * 25                                    # ~20 MiB: three parts
        size = sum(map(len, pieces))
        assert size > 2 * PART_BYTES
        row = store.create_file(iter(pieces), purpose="batch", filename="big.jsonl")
        assert row.location and row.location.startswith("s3://files/t-")
        _, key = split_s3(row.location)
        assert key in objects(local_s3)
        got = hashlib.sha256()
        n = 0
        for chunk in store.iter_file(row.id):
            assert len(chunk) <= 1 << 20                         # streamed, never whole
            got.update(chunk)
            n += len(chunk)
        assert (n, got.hexdigest()) == (size, row.sha256)
        lines = list(store.iter_file_lines(row.id, start=99_999))
        assert lines[0] == (99_999, b'{"n": 3998, "pad": "' + b"x" * 200 + b'"}')
        small = store.create_file(iter([b"a\n", b"b"]), purpose="batch", filename="s.jsonl")
        assert [l for _, l in store.iter_file_lines(small.id)] == [b"a", b"b"]
        assert store.delete_file(row.id) and key not in objects(local_s3)
        old = store.create_file(iter([b"x\n"]), purpose="batch", filename="o.jsonl",
                                expires_at=utcnow() - timedelta(seconds=1))
        assert old.id in store.delete_expired_files()
        assert split_s3(old.location)[1] not in objects(local_s3)

        def broken():
            yield piece * 3
            raise OSError("the upload broke")
        before = objects(local_s3)
        with pytest.raises(OSError):
            store.create_file(broken(), purpose="batch", filename="broken.jsonl")
        assert objects(local_s3) == before                       # the multipart was aborted
    finally:
        store.close()
