"""File content on object storage (INFLIGHT_FILES_URL=s3://bucket/prefix; any S3-compatible
store, boto3): uploads, batch inputs and outputs live there instead of `file_chunks`.

    files = ObjectFiles("s3://bucket/prefix", endpoint=None)
    w = files.writer(file_id); w.write(piece) ...; location = w.finish()   # or w.abort()
    for piece in files.read(location): ...
    files.delete(location)

NOTE: nothing is held whole. A writer buffers one part (PART_BYTES) and sends it as a part
of a multipart upload (a file smaller than one part is one PUT); a reader streams the
object's body in READ_BYTES pieces. The file row (store.files) keeps the object's
`location` (`s3://bucket/key`), so a file written before the setting changed is still read
from where it is (NULL: the database's chunks).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from inflight.schemas.errors import SchemaError, StoreError, require_extra

PART_BYTES = 8 << 20     # S3's parts are at least 5 MiB (all but the last)
READ_BYTES = 1 << 20


def split_s3(url: str) -> tuple[str, str]:
    """("bucket", "prefix") of s3://bucket/prefix (prefix without slashes at its ends)."""
    parts = urlsplit(url)
    if parts.scheme != "s3" or not parts.netloc:
        raise SchemaError(f"INFLIGHT_FILES_URL={url!r}: give s3://bucket/prefix (or leave it "
                          "empty: files in the database)", field="files_url")
    return parts.netloc, parts.path.strip("/")


class ObjectFiles:
    def __init__(self, url: str, *, endpoint: str | None = None, client: Any = None):
        self.url = url
        self.bucket, self.prefix = split_s3(url)
        if client is None:
            require_extra("jobs", f"files on object storage ({url})", "boto3")
            import boto3

            client = boto3.client("s3", endpoint_url=endpoint)
        self.s3 = client

    def key(self, file_id: str) -> str:
        return f"{self.prefix}/{file_id}" if self.prefix else file_id

    def writer(self, file_id: str) -> "ObjectWriter":
        return ObjectWriter(self, self.key(file_id))

    def read(self, location: str) -> Iterator[bytes]:
        bucket, key = split_s3(location)
        try:
            body = self.s3.get_object(Bucket=bucket, Key=key)["Body"]
        except Exception as exc:  # noqa: BLE001 - botocore's errors, named in the message
            raise StoreError(f"reading {location} failed: {exc}") from exc
        try:
            yield from body.iter_chunks(READ_BYTES)
        finally:
            body.close()

    def delete(self, location: str) -> None:
        bucket, key = split_s3(location)
        try:
            self.s3.delete_object(Bucket=bucket, Key=key)
        except Exception as exc:  # noqa: BLE001
            raise StoreError(f"deleting {location} failed: {exc}") from exc


class ObjectWriter:
    """One object written in parts; `finish()` returns its location."""

    def __init__(self, files: ObjectFiles, key: str):
        self.files, self.key = files, key
        self.buf = bytearray()
        self.upload_id: str | None = None
        self.parts: list[dict[str, Any]] = []

    @property
    def location(self) -> str:
        return f"s3://{self.files.bucket}/{self.key}"

    def write(self, piece: bytes) -> None:
        self.buf += piece
        while len(self.buf) >= PART_BYTES:
            self._part(bytes(self.buf[:PART_BYTES]))
            del self.buf[:PART_BYTES]

    def _part(self, data: bytes) -> None:
        s3 = self.files.s3
        try:
            if self.upload_id is None:
                self.upload_id = s3.create_multipart_upload(Bucket=self.files.bucket,
                                                            Key=self.key)["UploadId"]
            n = len(self.parts) + 1
            etag = s3.upload_part(Bucket=self.files.bucket, Key=self.key, PartNumber=n,
                                  UploadId=self.upload_id, Body=data)["ETag"]
        except Exception as exc:  # noqa: BLE001
            raise StoreError(f"writing {self.location} failed: {exc}") from exc
        self.parts.append({"PartNumber": n, "ETag": etag})

    def finish(self) -> str:
        s3 = self.files.s3
        try:
            if self.upload_id is None:  # smaller than one part: one PUT
                s3.put_object(Bucket=self.files.bucket, Key=self.key, Body=bytes(self.buf))
            else:
                if self.buf:
                    self._part(bytes(self.buf))
                s3.complete_multipart_upload(Bucket=self.files.bucket, Key=self.key,
                                             UploadId=self.upload_id,
                                             MultipartUpload={"Parts": self.parts})
        except StoreError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise StoreError(f"writing {self.location} failed: {exc}") from exc
        self.buf = bytearray()
        return self.location

    def abort(self) -> None:
        try:
            if self.upload_id is not None:
                self.files.s3.abort_multipart_upload(Bucket=self.files.bucket, Key=self.key,
                                                     UploadId=self.upload_id)
        except Exception:  # noqa: BLE001 - best effort: a failed write is already failing
            pass
