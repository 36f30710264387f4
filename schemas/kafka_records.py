"""Tolerant record parsing: a header key that is not UTF-8 must not stop a consumer.

kafka-python decodes every header key with a strict `bytes.decode("utf-8")` while it
iterates a fetched record batch (kafka.record.default_records.DefaultRecordBatch._read_msg).
A key that is not UTF-8 (any non-Python producer can write one) raises CorruptRecordError
from `poll()` with the partition's position left on that record, and the exception names
neither the partition nor the offset: no caller can skip it, so every restart of a worker
or a recorder dies on the same record and the whole group stops.

`install()` wraps that one method: a record parses exactly as before, and only when the
strict decode fails is the same record parsed again here with its header keys decoded
with errors="backslashreplace" (b"k\\xff" -> "k\\\\xff"). The record then goes the normal way:
a valid request runs, a bad one gets its error row and DLQ copy, its neighbours go on.

NOTE: why backslashreplace and not another handler —
- "surrogateescape" would keep the bytes, but kafka-python itself re-encodes header keys
  strictly (the fetcher's header_size, the producer when a worker forwards the headers to
  the DLQ), so the same record would crash one step later;
- "replace" (U+FFFD, what the Java client does) re-encodes fine but loses the bytes;
- "backslashreplace" re-encodes fine (pure ASCII escapes) and keeps the bytes readable in
  the DLQ copy.
The wrapper is installed once per process (idempotent), by schemas.kafka_clients.connect,
so every client this project builds (worker, recorder, cancel reader, Client.stream)
reads such records. It changes nothing where kafka-python succeeds; if a kafka-python
upgrade moves the method, install() says so in the log and the regression test fails.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from kafka.record import default_records
from kafka.record.util import decode_varint

log = logging.getLogger("inflight.kafka")

_lock = threading.Lock()
_MARK = "_inflight_tolerant_header_keys"


def install() -> bool:
    """Make DefaultRecordBatch tolerate header keys that are not UTF-8 (idempotent).
    Returns whether the tolerant parse is in place."""
    batch_cls = default_records.DefaultRecordBatch
    with _lock:
        original = getattr(batch_cls, "_read_msg", None)
        if original is None or not {"_buffer", "_pos"} <= set(batch_cls.__slots__):
            log.warning("kafka-python's DefaultRecordBatch has changed: records whose header "
                        "keys are not UTF-8 will stop consumers (schemas/kafka_records.py)")
            return False
        if getattr(original, _MARK, False):
            return True

        def _read_msg(self: Any, *args: Any, **kwargs: Any) -> Any:
            pos = self._pos  # the strict parse only moves it once the record is read
            try:
                return original(self, *args, **kwargs)
            except UnicodeDecodeError:
                if self.is_control_batch:
                    raise
                self._pos = pos
                return _read_record_leniently(self)

        setattr(_read_msg, _MARK, True)
        _read_msg.__doc__ = original.__doc__
        batch_cls._read_msg = _read_msg
        return True


def _read_record_leniently(batch: Any) -> Any:
    """One v2 record at batch._pos (KIP-98 layout), header keys decoded leniently:

        length varint | attributes int8 | timestampDelta varlong | offsetDelta varint |
        keyLength varint | key | valueLength varint | value | headerCount varint |
        [headerKeyLength varint | headerKey | headerValueLength varint | headerValue]
    """
    buf, pos = batch._buffer, batch._pos
    length, pos = decode_varint(buf, pos)
    start = pos
    _attributes, pos = decode_varint(buf, pos)
    ts_delta, pos = decode_varint(buf, pos)
    timestamp = (batch.max_timestamp if batch.timestamp_type == batch.LOG_APPEND_TIME
                 else batch.first_timestamp + ts_delta)
    offset_delta, pos = decode_varint(buf, pos)
    key, pos = _nullable_bytes(buf, pos)
    value, pos = _nullable_bytes(buf, pos)
    count, pos = decode_varint(buf, pos)
    if count < 0:
        raise ValueError(f"invalid number of record headers {count}")
    headers = []
    for _ in range(count):
        raw_key, pos = _nullable_bytes(buf, pos)
        if raw_key is None:
            raise ValueError("a record header key is null")
        h_value, pos = _nullable_bytes(buf, pos)
        headers.append((raw_key.decode("utf-8", "backslashreplace"), h_value))
    if pos - start != length:
        raise ValueError(f"invalid record size: expected {length} bytes, read {pos - start}")
    batch._pos = pos
    return default_records.DefaultRecord(length, batch.base_offset + offset_delta, timestamp,
                                         batch.timestamp_type, key, value, headers)


def _nullable_bytes(buf: bytearray, pos: int) -> tuple[bytes | None, int]:
    n, pos = decode_varint(buf, pos)
    if n < 0:
        return None, pos
    return bytes(buf[pos:pos + n]), pos + n
