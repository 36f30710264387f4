"""Produce records byte by byte, as a non-Python producer may: header keys that are not
UTF-8 and null header values, which kafka-python's producer refuses to send.

The record batch is built by kafka-python's DefaultRecordBatchBuilder (a header key is
written as whatever its `.encode("utf-8")` returns); the ProduceRequest (v3, the first with
record batches v2) is framed here by hand and sent over a plain socket to the bootstrap
broker (the embedded broker is a single node that leads every partition).
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Sequence

from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.util import calc_crc32c

Header = tuple[str | bytes, bytes | None]


class _RawHeaderKey(str):
    """A header key whose wire bytes are given as they are (possibly not UTF-8)."""

    raw: bytes

    def __new__(cls, raw: bytes) -> "_RawHeaderKey":
        obj = super().__new__(cls, raw.decode("latin-1"))
        obj.raw = raw
        return obj

    def encode(self, *_args, **_kw) -> bytes:  # type: ignore[override]
        return self.raw


def record_batch(records: Sequence[tuple[bytes | None, bytes | None, Sequence[Header]]]) -> bytes:
    """A v2 record batch of (key, value, headers); a bytes header key goes out verbatim."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 22)
    for i, (key, value, headers) in enumerate(records):
        hdrs = [(_RawHeaderKey(k) if isinstance(k, bytes) else k, v) for k, v in headers]
        if builder.append(i, timestamp=None, key=key, value=value, headers=hdrs) is None:
            raise ValueError("records do not fit in one batch")
    return bytes(builder.build())


def _string(s: str) -> bytes:
    b = s.encode()
    return struct.pack(">h", len(b)) + b


def _read_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        buf += chunk
    return buf


def with_bad_crc(batch: bytes) -> bytes:
    """The batch with its last byte flipped: the CRC no longer matches."""
    return batch[:-1] + bytes([batch[-1] ^ 0xFF])


def with_bad_framing(batch: bytes) -> bytes:
    """The batch with its first record's length varint wrong and the CRC made to match
    again (the broker cannot tell; a consumer cannot parse it)."""
    b = bytearray(batch)
    b[_RECORDS_START] = 0x7E  # varint 63
    struct.pack_into(">I", b, _CRC_AT, calc_crc32c(memoryview(b)[_CRC_AT + 4:]))
    return bytes(b)


def with_record_count(batch: bytes, count: int) -> bytes:
    """The batch claiming `count` records (CRC recomputed)."""
    b = bytearray(batch)
    struct.pack_into(">i", b, _RECORDS_START - 4, count)
    struct.pack_into(">I", b, _CRC_AT, calc_crc32c(memoryview(b)[_CRC_AT + 4:]))
    return bytes(b)


# v2 batch header: baseOffset int64, batchLength int32, partitionLeaderEpoch int32, magic
# int8, crc uint32 (over everything after it), ..., recordCount int32, then the records
_CRC_AT, _RECORDS_START = 17, 61


def produce_raw(bootstrap: str, topic: str, partition: int,
                records: Sequence[tuple[bytes | None, bytes | None, Sequence[Header]]] | bytes,
                timeout: float = 10.0) -> int:
    """Append `records` (or a record batch, as bytes) to one partition with acks=all;
    returns the base offset."""
    batch = records if isinstance(records, bytes) else record_batch(records)
    body = (struct.pack(">hhi", 0, 3, 1) + _string("raw-test")      # Produce v3, correlation 1
            + struct.pack(">hhi", -1, -1, int(timeout * 1000))       # no txn id, acks=all
            + struct.pack(">i", 1) + _string(topic)
            + struct.pack(">ii", 1, partition) + struct.pack(">i", len(batch)) + batch)
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(struct.pack(">i", len(body)) + body)
        size, = struct.unpack(">i", _read_exact(sock, 4))
        resp = _read_exact(sock, size)
    # correlation id, [topic [partition error_code base_offset log_append_time]], throttle
    pos = 4 + 4
    name_len, = struct.unpack_from(">h", resp, pos)
    pos += 2 + name_len + 4
    _part, error_code, base_offset = struct.unpack_from(">ihq", resp, pos)
    if error_code != 0:
        raise RuntimeError(f"produce to {topic}/{partition} failed with Kafka error {error_code}")
    return base_offset
