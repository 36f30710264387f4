"""Tolerant record parsing: no record a broker hands out may stop a consumer of ours.

kafka-python parses fetched record batches inside `poll()`. Two kinds of records made it
raise CorruptRecordError there, with the partition's position left on that record, at
every restart, so that the whole group stopped:

1. A header key that is not UTF-8 (any non-Python producer can write one): kafka-python
   decodes keys with a strict `bytes.decode("utf-8")`
   (kafka.record.default_records.DefaultRecordBatch._read_msg). Such a record is parsed
   again here with its header keys decoded with errors="backslashreplace"
   (b"k\xff" -> "k\\xff") and then goes the normal way: a valid request runs, a bad one
   gets its error row and DLQ copy, its neighbours go on.
2. A batch whose CRC or record framing is broken. Real Kafka refuses those on produce;
   the embedded broker (Tansu) stores them. Nothing of such a batch can be trusted, not
   even its records' offsets, so its records are skipped with an error in the log that
   names the partition and the offsets (kafka.consumer.fetcher's
   PartitionRecords._unpack_records is wrapped for that); the consumer goes on after it.

NOTE: why backslashreplace and not another handler —
- "surrogateescape" would keep the bytes, but kafka-python itself re-encodes header keys
  strictly (the fetcher's header_size, the producer when a worker forwards the headers to
  the DLQ), so the same record would crash one step later;
- "replace" (U+FFFD, what the Java client does) re-encodes fine but loses the bytes;
- "backslashreplace" re-encodes fine (pure ASCII escapes) and keeps the bytes readable in
  the DLQ copy.
`install()` runs once per process (idempotent), from transport.kafka_clients.connect, so
every client this project builds (worker, recorder, cancel reader, Client.stream) reads
this way. Both wrappers change nothing where kafka-python succeeds; if a kafka-python
upgrade moves what they wrap, install() says so in the log and the regression tests fail.
"""

from __future__ import annotations

import logging
import struct
import threading
from typing import Any

from kafka.consumer import fetcher
from kafka.errors import CorruptRecordError
from kafka.record import default_records
from kafka.record.memory_records import MemoryRecords
from kafka.record.util import decode_varint

from inflight.transport.kafka_wrap import wrap_method

log = logging.getLogger("inflight.kafka")

_lock = threading.Lock()
_MARK = "_inflight_tolerant"


def install() -> bool:
    """Make kafka-python's record parsing tolerant (idempotent). Returns whether both
    wrappers are in place."""
    with _lock:
        return _install_header_keys() & _install_batch_skip()


def _install_header_keys() -> bool:
    batch_cls = default_records.DefaultRecordBatch

    def wrap(original: Any) -> Any:
        def _read_msg(self: Any, *args: Any, **kwargs: Any) -> Any:
            pos = self._pos  # the strict parse only moves it once the record is read
            try:
                return original(self, *args, **kwargs)
            except UnicodeDecodeError:
                if self.is_control_batch:
                    raise
                self._pos = pos
                return _read_record_leniently(self)
        return _read_msg

    return wrap_method(batch_cls, "_read_msg", wrap, mark=_MARK,
                       fits=lambda: {"_buffer", "_pos"} <= set(batch_cls.__slots__),
                       changed="kafka-python's DefaultRecordBatch has changed: records whose "
                               "header keys are not UTF-8 will stop consumers "
                               "(transport/kafka_records.py)")


def _install_batch_skip() -> bool:
    records_cls = getattr(fetcher.Fetcher, "PartitionRecords", None)

    def wrap(original: Any) -> Any:
        def _unpack_records(self: Any, tp: Any, records: Any, *args: Any) -> Any:
            inner = original(self, tp, records, *args)
            while True:
                try:
                    record = next(inner)
                except StopIteration:
                    return
                except CorruptRecordError as exc:
                    _skip_corrupt_batch(self, tp, records, exc)
                    return
                yield record
        return _unpack_records

    return wrap_method(records_cls, "_unpack_records", wrap, mark=_MARK,
                       fits=lambda: hasattr(records_cls, "drain"),
                       changed="kafka-python's Fetcher.PartitionRecords has changed: a corrupt "
                               "record batch will stop consumers (transport/kafka_records.py)")


def _skip_corrupt_batch(part: Any, tp: Any, records: Any, exc: Exception) -> None:
    """Move the partition's next fetch past the batch holding `part.next_fetch_offset` (the
    first offset not returned), log it, and end this fetch (the fetcher drains it; records
    after that batch are fetched again)."""
    bad = part.next_fetch_offset
    end = _batch_end(records, bad)
    log.error("%s/%d: records at offsets %d..%d cannot be parsed and are skipped (%s); "
              "a producer wrote a corrupt record batch", tp.topic, tp.partition, bad, end - 1,
              exc)
    part.next_fetch_offset = end
    part.drain()


def _batch_end(records: Any, offset: int) -> int:
    """Where to fetch next: after the batch that holds `offset` (the first offset not
    returned), or `offset` itself when that batch starts there, is sound, and follows
    another (then the corrupt batch was that one, all its records came out, and only its
    trailing bytes were wrong). offset + 1 when not even batch headers can be read."""
    try:
        batches = MemoryRecords(bytes(records._buffer))
        previous = None
        while (batch := batches.next_batch()) is not None:
            if batch.magic < 2:
                break
            if batch.next_offset > offset:
                if previous is not None and batch.base_offset >= offset and _sound(batch):
                    return offset
                return batch.next_offset
            previous = batch
    except (CorruptRecordError, ValueError, IndexError, AttributeError, struct.error):
        pass
    return offset + 1


def _sound(batch: Any) -> bool:
    try:
        if not batch.validate_crc():
            return False
        for _ in batch:
            pass
    except (CorruptRecordError, ValueError, IndexError, AssertionError):
        return False
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
