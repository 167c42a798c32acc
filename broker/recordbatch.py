"""Kafka RecordBatch v2 (magic 2) headers: parse, validate, re-stamp, and build batches for tests and tools.

The broker stores batches exactly as the client sent them (only the base offset, which lies outside
the CRC, is rewritten), so nothing here decompresses records.  The header layout, what
``split_batches`` refuses beyond Kafka and what it leaves to others are in docs/brokers.md,
"A partition's log on disk".
"""
from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from crc32c import crc32c

from records.wire.bounds import encode_uvarint
from records.wire.errors import Errors, PidQuorumError

HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61
LOG_OVERHEAD = 12  # baseOffset + batchLength: the part of a batch batchLength does not count
MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD  # 49
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21  # the CRC covers data[21:]
CURRENT_MAGIC = 2

INT32_MAX = 2**31 - 1
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_TIMESTAMP = -1

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_BIT = 0x08
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20
MAX_COMPRESSION_CODEC = 4  # none, gzip, snappy, lz4, zstd
COMPRESSION_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}

# Control records (Kafka's ControlRecordType and EndTransactionMarker): the key is (version, type), the
# value of an end-of-transaction marker (version, coordinator epoch).
CONTROL_KEY = struct.Struct(">hh")
END_TXN_MARKER_VALUE = struct.Struct(">hi")
CONTROL_ABORT = 0
CONTROL_COMMIT = 1


class BatchError(PidQuorumError):
    """A batch (or the records blob holding it) is invalid; ``code`` is the Kafka error to answer with."""

    def __init__(self, code: Errors, message: str):
        self.code = code  # shadows PidQuorumError.code (a class attribute) for this instance
        super().__init__(message)


def increment_sequence(sequence: int, increment: int) -> int:
    """``sequence + increment`` wrapping from 2**31-1 to 0, as Kafka's producer sequences do."""
    return (sequence + increment) % (INT32_MAX + 1)


@dataclass(frozen=True, slots=True)
class BatchHeader:
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_BIT)

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def timestamp_type(self) -> int:
        """0 = CreateTime, 1 = LogAppendTime."""
        return 1 if self.attributes & TIMESTAMP_TYPE_BIT else 0

    @property
    def last_sequence(self) -> int:
        """Sequence of the last record (wrapping at 2**31-1 to 0); -1 if the batch has no sequence."""
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return increment_sequence(self.base_sequence, self.last_offset_delta)

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def size(self) -> int:
        """Bytes of the whole batch, header included."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id >= 0


def parse_header(data: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Unpack the 61-byte header at ``pos`` without any validation (``struct.error`` if too short)."""
    return BatchHeader(*HEADER.unpack_from(data, pos))


def batch_crc(data: bytes | bytearray | memoryview, pos: int, size: int) -> int:
    """CRC-32C of the batch at ``data[pos:pos+size]`` (attributes to the end)."""
    return crc32c(memoryview(data)[pos + ATTRIBUTES_OFFSET:pos + size])


def check_framing(data: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Validate the framing of the batch at ``pos``: size, magic and CRC; return its header.

    Raises ``BatchError``: UNSUPPORTED_FOR_MESSAGE_FORMAT for magic 0/1 (legacy
    message sets), CORRUPT_MESSAGE for everything else.  Used both on client
    input and on the log's own segment files during recovery.
    """
    remaining = len(data) - pos
    if remaining < MAGIC_OFFSET + 1:
        raise BatchError(Errors.CORRUPT_MESSAGE,
                         f"truncated batch at byte {pos}: {remaining} bytes left, a batch header needs {HEADER_SIZE}")
    magic = struct.unpack_from(">b", data, pos + MAGIC_OFFSET)[0]
    if magic in (0, 1):
        raise BatchError(Errors.UNSUPPORTED_FOR_MESSAGE_FORMAT,
                         f"batch at byte {pos}: magic {magic} (legacy message format); only record batch v2 "
                         f"(magic 2) is supported")
    if magic != CURRENT_MAGIC:
        raise BatchError(Errors.CORRUPT_MESSAGE, f"batch at byte {pos}: invalid magic {magic} (expected 2)")
    if remaining < HEADER_SIZE:
        raise BatchError(Errors.CORRUPT_MESSAGE,
                         f"truncated batch at byte {pos}: {remaining} bytes left, a batch header needs {HEADER_SIZE}")
    h = parse_header(data, pos)
    if h.batch_length < MIN_BATCH_LENGTH:
        raise BatchError(Errors.CORRUPT_MESSAGE,
                         f"batch at byte {pos}: batchLength {h.batch_length} is below the minimum {MIN_BATCH_LENGTH}")
    if h.size > remaining:
        raise BatchError(Errors.CORRUPT_MESSAGE,
                         f"batch at byte {pos}: batchLength {h.batch_length} runs past the end of the data "
                         f"({remaining - LOG_OVERHEAD} bytes left after the length field)")
    actual = batch_crc(data, pos, h.size)
    if actual != h.crc:
        raise BatchError(Errors.CORRUPT_MESSAGE,
                         f"batch at byte {pos}: CRC-32C mismatch (header says {h.crc:#010x}, data gives {actual:#010x})")
    return h


def valid_batch_after(data: bytes, start: int) -> bool:
    """Does any checksum-valid v2 batch start at or after ``start``?  (Slow-ish; only on a damaged file.)"""
    magic = bytes([CURRENT_MAGIC])
    idx = data.find(magic, start + MAGIC_OFFSET)
    while idx != -1:
        try:
            check_framing(data, idx - MAGIC_OFFSET)
            return True
        except BatchError:
            pass
        idx = data.find(magic, idx + 1)
    return False


def validate_client_batch(h: BatchHeader, pos: int = 0) -> None:
    """Checks a Produce request's batch must pass beyond framing; raises ``BatchError``."""
    where = f"batch at byte {pos}"
    if h.records_count < 1:
        raise BatchError(Errors.INVALID_RECORD, f"{where}: recordsCount {h.records_count}; a batch needs at least one record")
    if h.last_offset_delta != h.records_count - 1:
        raise BatchError(Errors.INVALID_RECORD,
                         f"{where}: lastOffsetDelta {h.last_offset_delta} does not match recordsCount "
                         f"{h.records_count} (expected {h.records_count - 1})")
    if h.compression > MAX_COMPRESSION_CODEC:
        raise BatchError(Errors.UNSUPPORTED_COMPRESSION_TYPE,
                         f"{where}: unknown compression codec {h.compression} in attributes {h.attributes:#06x}")
    if h.is_control:
        raise BatchError(Errors.INVALID_RECORD, f"{where}: control batches (attributes {h.attributes:#06x}) may not be "
                                                f"produced by clients")
    if h.producer_id < NO_PRODUCER_ID:
        raise BatchError(Errors.INVALID_RECORD, f"{where}: invalid producerId {h.producer_id}")
    if h.producer_id >= 0:
        if h.producer_epoch < 0:
            raise BatchError(Errors.INVALID_RECORD,
                             f"{where}: producerId {h.producer_id} with invalid producerEpoch {h.producer_epoch}")
        if h.base_sequence < 0:
            raise BatchError(Errors.INVALID_RECORD,
                             f"{where}: producerId {h.producer_id} with invalid baseSequence {h.base_sequence}")
    elif h.is_transactional:
        raise BatchError(Errors.INVALID_RECORD, f"{where}: transactional batch without a producerId")


def split_batches(records: bytes | bytearray | memoryview, *,
                  max_batch_bytes: int | None = None) -> list[tuple[BatchHeader, bytes]]:
    """Split and validate one partition's records blob from a Produce request.

    Returns ``(header, batch bytes)`` for every batch, in order.  Raises
    ``BatchError`` on the first invalid batch (the whole blob is then to be
    refused: nothing of it may be appended).  ``max_batch_bytes`` (the topic's
    ``max.message.bytes``) bounds each batch: MESSAGE_TOO_LARGE above it.
    """
    data = bytes(records)
    if not data:
        raise BatchError(Errors.INVALID_RECORD, "empty records: a produce request needs at least one record batch")
    out: list[tuple[BatchHeader, bytes]] = []
    pos = 0
    while pos < len(data):
        h = check_framing(data, pos)
        validate_client_batch(h, pos)
        if max_batch_bytes is not None and h.size > max_batch_bytes:
            raise BatchError(Errors.MESSAGE_TOO_LARGE,
                             f"batch at byte {pos}: {h.size} bytes is above the limit of {max_batch_bytes}")
        out.append((h, data[pos:pos + h.size]))
        pos += h.size
    return out


def with_base_offset(batch: bytes, base_offset: int) -> bytes:
    """The batch with its base offset replaced (the base offset lies outside the CRC)."""
    return struct.pack(">q", base_offset) + bytes(batch[8:])


# ------------------------------------------------------------------ varints

def _zigzag_varint(value: int) -> bytes:
    return encode_uvarint(((value << 1) ^ (value >> 63)) & ((1 << 64) - 1))


def _read_varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    z = 0
    shift = 0
    while True:
        if pos >= end:
            raise ValueError("varint runs past the end of the record")
        b = data[pos]
        pos += 1
        z |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")
    return (z >> 1) ^ -(z & 1), pos


def _varbytes(value: bytes | None) -> bytes:
    if value is None:
        return _zigzag_varint(-1)
    return _zigzag_varint(len(value)) + value


def _read_varbytes(data: bytes, pos: int, end: int) -> tuple[bytes | None, int]:
    n, pos = _read_varint(data, pos, end)
    if n == -1:
        return None, pos
    if n < 0 or pos + n > end:
        raise ValueError(f"byte field of length {n} runs past the end of the record")
    return data[pos:pos + n], pos + n


# ------------------------------------------------------------------ building

Header = tuple[str | bytes, bytes | None]
RecordSpec = tuple[bytes | None, bytes | None] | tuple[bytes | None, bytes | None, Sequence[Header]]


def encode_batch(records: Sequence[RecordSpec], *, base_offset: int = 0, timestamp_ms: int = 0,
                 timestamps: Sequence[int] | None = None, producer_id: int = NO_PRODUCER_ID,
                 producer_epoch: int = NO_PRODUCER_EPOCH, base_sequence: int = NO_SEQUENCE,
                 transactional: bool = False, log_append_time: bool = False,
                 partition_leader_epoch: int = -1, control: bool = False) -> bytes:
    """Build a valid, uncompressed RecordBatch v2 from ``(key, value[, headers])`` tuples.

    Each record's timestamp is ``timestamps[i]`` if given, else ``timestamp_ms``.
    For tests and tools; a real client would produce the same bytes.  ``control``
    sets the control bit (only the broker writes such batches: ``encode_control_batch``).
    """
    if not records:
        raise ValueError("a record batch needs at least one record")
    if timestamps is not None and len(timestamps) != len(records):
        raise ValueError("timestamps must have one entry per record")
    ts = list(timestamps) if timestamps is not None else [timestamp_ms] * len(records)
    base_ts = ts[0]
    body = bytearray()
    for delta, spec in enumerate(records):
        key, value = spec[0], spec[1]
        headers = spec[2] if len(spec) > 2 else ()  # type: ignore[misc]
        rec = bytearray(b"\x00")  # record attributes: unused, 0
        rec += _zigzag_varint(ts[delta] - base_ts)
        rec += _zigzag_varint(delta)
        rec += _varbytes(key)
        rec += _varbytes(value)
        rec += _zigzag_varint(len(headers))
        for hkey, hvalue in headers:
            rec += _varbytes(hkey.encode() if isinstance(hkey, str) else hkey)
            rec += _varbytes(hvalue)
        body += _zigzag_varint(len(rec)) + rec
    attributes = ((TRANSACTIONAL_BIT if transactional else 0) | (TIMESTAMP_TYPE_BIT if log_append_time else 0)
                  | (CONTROL_BIT if control else 0))
    after_crc = struct.pack(">hiqqqhii", attributes, len(records) - 1, base_ts, max(ts), producer_id,
                            producer_epoch, base_sequence, len(records)) + bytes(body)
    batch_length = 4 + 1 + 4 + len(after_crc)  # partitionLeaderEpoch + magic + crc + rest
    return struct.pack(">qiibI", base_offset, batch_length, partition_leader_epoch, CURRENT_MAGIC,
                       crc32c(after_crc)) + after_crc


def encode_control_batch(producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int = 0, *,
                         timestamp_ms: int, base_offset: int = 0, partition_leader_epoch: int = -1) -> bytes:
    """An end-of-transaction marker as Kafka's broker writes it (``MemoryRecords.withEndTransactionMarker``).

    A transactional control batch (attributes 0x30, CreateTime, uncompressed) of the producer's id and
    epoch with base sequence -1 (a marker has no sequence: it is not a producer's write) and one record:
    key ``>hh`` (version 0, type 0 ABORT / 1 COMMIT), value ``>hi`` (version 0, coordinator epoch).
    Consumers read the key to tell an abort from a commit and skip the batch; read_committed consumers
    drop an aborted producer's batches up to it.
    """
    key = CONTROL_KEY.pack(0, CONTROL_COMMIT if commit else CONTROL_ABORT)
    value = END_TXN_MARKER_VALUE.pack(0, coordinator_epoch)
    return encode_batch([(key, value)], base_offset=base_offset, timestamp_ms=timestamp_ms,
                        producer_id=producer_id, producer_epoch=producer_epoch, base_sequence=NO_SEQUENCE,
                        transactional=True, control=True, partition_leader_epoch=partition_leader_epoch)


def control_record_type(batch: bytes) -> int:
    """The type of the control record of a control batch (``CONTROL_ABORT``, ``CONTROL_COMMIT``, or
    another of Kafka's control types); ``BatchError`` CORRUPT_MESSAGE if the batch holds no control key."""
    for r in iter_records(batch):
        if r.key is None or len(r.key) < CONTROL_KEY.size:
            raise BatchError(Errors.CORRUPT_MESSAGE, f"batch at offset {r.offset}: control record without a "
                                                     f"control key ({r.key!r})")
        version, type_ = CONTROL_KEY.unpack_from(r.key)
        if version < 0:
            raise BatchError(Errors.CORRUPT_MESSAGE, f"batch at offset {r.offset}: control key version {version}")
        return type_
    raise BatchError(Errors.CORRUPT_MESSAGE, "control batch without records")


@dataclass(frozen=True, slots=True)
class DecodedRecord:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[bytes | None, bytes | None], ...]


def iter_records(batch: bytes) -> Iterator[DecodedRecord]:
    """The records of one uncompressed batch (framing and CRC are checked first).

    Raises ``BatchError`` (UNSUPPORTED_COMPRESSION_TYPE) for a compressed batch
    and CORRUPT_MESSAGE for records that do not parse or do not fill the batch.
    """
    data = bytes(batch)
    h = check_framing(data, 0)
    if h.compression != 0:
        raise BatchError(Errors.UNSUPPORTED_COMPRESSION_TYPE,
                         f"cannot decode records compressed with {COMPRESSION_NAMES.get(h.compression, h.compression)}")
    end = h.size
    pos = HEADER_SIZE
    try:
        for i in range(h.records_count):
            length, pos = _read_varint(data, pos, end)
            rec_end = pos + length
            if length < 0 or rec_end > end:
                raise ValueError(f"record {i} of length {length} runs past the end of the batch")
            pos += 1  # record attributes
            ts_delta, pos = _read_varint(data, pos, rec_end)
            off_delta, pos = _read_varint(data, pos, rec_end)
            key, pos = _read_varbytes(data, pos, rec_end)
            value, pos = _read_varbytes(data, pos, rec_end)
            n_headers, pos = _read_varint(data, pos, rec_end)
            if n_headers < 0:
                raise ValueError(f"record {i}: negative header count {n_headers}")
            headers = []
            for _ in range(n_headers):
                hk, pos = _read_varbytes(data, pos, rec_end)
                hv, pos = _read_varbytes(data, pos, rec_end)
                headers.append((hk, hv))
            if pos != rec_end:
                raise ValueError(f"record {i}: length {length} does not match its fields")
            timestamp = h.max_timestamp if h.timestamp_type == 1 else h.base_timestamp + ts_delta
            yield DecodedRecord(h.base_offset + off_delta, timestamp, key, value, tuple(headers))
        if pos != end:
            raise ValueError(f"{end - pos} bytes after the last of {h.records_count} records")
    except ValueError as e:
        raise BatchError(Errors.CORRUPT_MESSAGE, f"batch at offset {h.base_offset}: {e}") from None


def decode_records(batch: bytes) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """``(offset, timestamp, key, value)`` for each record of one uncompressed batch."""
    return [(r.offset, r.timestamp, r.key, r.value) for r in iter_records(batch)]


def decode_all(blob: bytes) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """``decode_records`` over every batch in a blob of back-to-back batches (e.g. a ``read`` result)."""
    out: list[tuple[int, int, bytes | None, bytes | None]] = []
    pos = 0
    while pos < len(blob):
        h = check_framing(blob, pos)
        out.extend(decode_records(blob[pos:pos + h.size]))
        pos += h.size
    return out
