"""Unit tests for broker.recordbatch: building, splitting and validating RecordBatch v2 bytes."""
from __future__ import annotations

import datetime
import io
import random
import struct

import pytest
from crc32c import crc32c
from kio.records.readers import read_batch
from kio.records.schema import NewRecordBatch, Record
from kio.records.writers import write_new_batch
from kio.static.primitive import i8, i16, i32, i64

from broker.recordbatch import (
    HEADER_SIZE,
    INT32_MAX,
    BatchError,
    BatchHeader,
    check_framing,
    decode_all,
    decode_records,
    encode_batch,
    increment_sequence,
    iter_records,
    parse_header,
    split_batches,
    with_base_offset,
)
from records.wire.errors import Errors

TS = 1_700_000_000_123


def batch(n=3, **kw) -> bytes:
    kw.setdefault("timestamp_ms", TS)
    return encode_batch([(b"k%d" % i, b"value-%d" % i) for i in range(n)], **kw)


def patch(data: bytes, fmt: str, offset: int, value, *, recrc: bool = True) -> bytes:
    """Overwrite a header field and (by default) reseal the CRC, so only the field is wrong."""
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    if recrc:
        struct.pack_into(">I", out, 17, crc32c(bytes(out[21:])))
    return bytes(out)


# Header field offsets (big-endian) inside a batch.
ATTRIBUTES, LAST_OFFSET_DELTA, PRODUCER_ID, PRODUCER_EPOCH, BASE_SEQUENCE, RECORDS_COUNT = 21, 23, 43, 51, 53, 57
BATCH_LENGTH, MAGIC = 8, 16


def code_of(data: bytes) -> Errors:
    with pytest.raises(BatchError) as ei:
        split_batches(data)
    return ei.value.code


# ------------------------------------------------------------------ round trips

def test_header_size_is_61():
    assert HEADER_SIZE == 61


def test_round_trip_header_fields():
    data = encode_batch([(b"a", b"1"), (None, b"2"), (b"c", None)], base_offset=42, timestamps=[TS, TS + 5, TS + 2],
                        producer_id=1234, producer_epoch=7, base_sequence=100, partition_leader_epoch=3)
    [(h, raw)] = split_batches(data)
    assert raw == data
    assert h == BatchHeader(base_offset=42, batch_length=len(data) - 12, partition_leader_epoch=3, magic=2,
                            crc=crc32c(data[21:]), attributes=0, last_offset_delta=2, base_timestamp=TS,
                            max_timestamp=TS + 5, producer_id=1234, producer_epoch=7, base_sequence=100,
                            records_count=3)
    assert h.size == len(data)
    assert h.last_sequence == 102
    assert h.has_producer_id and not h.is_transactional and not h.is_control
    assert h.compression == 0 and h.timestamp_type == 0
    assert (h.last_offset, h.next_offset) == (44, 45)


def test_round_trip_records_with_headers_and_nulls():
    data = encode_batch([(b"a", b"1", [("h1", b"x"), (b"h2", None)]), (None, None), (b"", b"z" * 1000)],
                        base_offset=10, timestamps=[TS, TS - 3, TS + 9])
    assert decode_records(data) == [(10, TS, b"a", b"1"), (11, TS - 3, None, None), (12, TS + 9, b"", b"z" * 1000)]
    assert list(iter_records(data))[0].headers == ((b"h1", b"x"), (b"h2", None))


def test_log_append_time_records_report_the_batch_max_timestamp():
    data = encode_batch([(None, b"1"), (None, b"2")], timestamps=[TS, TS + 1], log_append_time=True)
    h = parse_header(data)
    assert h.timestamp_type == 1
    assert [r[1] for r in decode_records(data)] == [TS + 1, TS + 1]


def test_properties_from_attributes():
    h = parse_header(patch(batch(), ">h", ATTRIBUTES, 0x10 | 0x08 | 3))
    assert h.is_transactional and not h.is_control and h.timestamp_type == 1 and h.compression == 3
    assert parse_header(patch(batch(), ">h", ATTRIBUTES, 0x20)).is_control


def test_several_batches_split_in_order():
    blob = batch(2, base_sequence=0, producer_id=1, producer_epoch=0) + batch(5) + batch(1)
    parts = split_batches(blob)
    assert [h.records_count for h, _ in parts] == [2, 5, 1]
    assert b"".join(raw for _, raw in parts) == blob


def test_with_base_offset_keeps_the_crc_valid():
    data = batch()
    moved = with_base_offset(data, 987654321)
    assert parse_header(moved).base_offset == 987654321
    assert moved[8:] == data[8:]
    assert check_framing(moved).crc == parse_header(data).crc
    assert [r[0] for r in decode_records(moved)] == [987654321, 987654322, 987654323]


def test_decode_all_walks_a_read_result():
    blob = with_base_offset(batch(2), 0) + with_base_offset(batch(1), 2)
    assert [r[0] for r in decode_all(blob)] == [0, 1, 2]


def test_sequence_wraps_at_int32_max():
    assert increment_sequence(INT32_MAX, 1) == 0
    assert increment_sequence(INT32_MAX - 1, 3) == 1
    assert increment_sequence(5, 2) == 7
    # records at MAX-1, MAX, 0
    assert parse_header(batch(3, producer_id=1, producer_epoch=0, base_sequence=INT32_MAX - 1)).last_sequence == 0
    # records at MAX, 0, 1
    assert parse_header(batch(3, producer_id=1, producer_epoch=0, base_sequence=INT32_MAX)).last_sequence == 1
    assert parse_header(batch(1, producer_id=1, producer_epoch=0, base_sequence=INT32_MAX)).last_sequence == INT32_MAX
    assert parse_header(batch(3)).last_sequence == -1  # no sequence at all


# ------------------------------------------------------------------ bad input

def test_empty_blob_is_invalid_record():
    assert code_of(b"") == Errors.INVALID_RECORD


def test_crc_flip_anywhere_in_the_covered_range_is_corrupt():
    data = batch()
    for pos in (21, 30, HEADER_SIZE, len(data) - 1):
        bad = bytearray(data)
        bad[pos] ^= 0x01
        with pytest.raises(BatchError) as ei:
            split_batches(bytes(bad))
        assert ei.value.code == Errors.CORRUPT_MESSAGE
        assert "CRC" in ei.value.message


def test_base_offset_and_leader_epoch_are_outside_the_crc():
    data = bytearray(batch())
    data[0] ^= 0xFF
    data[12] ^= 0xFF
    split_batches(bytes(data))  # no error


@pytest.mark.parametrize("cut", [1, 11, 16, 17, 30, 60, 61])
def test_truncated_blob_is_corrupt(cut):
    data = batch()
    assert code_of(data[:cut]) == Errors.CORRUPT_MESSAGE


def test_truncated_second_batch_is_corrupt_and_refuses_the_whole_blob():
    blob = batch() + batch()
    assert code_of(blob[:-1]) == Errors.CORRUPT_MESSAGE
    assert code_of(blob + b"\x00" * 10) == Errors.CORRUPT_MESSAGE


@pytest.mark.parametrize("length", [2**31 - 1, 10**9, -1, -(2**31), 0, 48])
def test_absurd_batch_length_is_corrupt(length):
    with pytest.raises(BatchError) as ei:
        split_batches(patch(batch(), ">i", BATCH_LENGTH, length, recrc=False))
    assert ei.value.code == Errors.CORRUPT_MESSAGE
    assert "batchLength" in ei.value.message and str(length) in ei.value.message


def test_batch_length_shorter_than_data_leaves_garbage_that_is_refused():
    data = batch()
    # One byte too short: the CRC no longer matches (and the rest is garbage).
    assert code_of(patch(data, ">i", BATCH_LENGTH, len(data) - 13, recrc=False)) == Errors.CORRUPT_MESSAGE


@pytest.mark.parametrize("magic", [0, 1])
def test_legacy_magic_is_unsupported_for_message_format(magic):
    with pytest.raises(BatchError) as ei:
        split_batches(patch(batch(), ">b", MAGIC, magic, recrc=False))
    assert ei.value.code == Errors.UNSUPPORTED_FOR_MESSAGE_FORMAT
    assert f"magic {magic}" in ei.value.message


@pytest.mark.parametrize("magic", [3, 127, -1])
def test_unknown_magic_is_corrupt(magic):
    assert code_of(patch(batch(), ">b", MAGIC, magic, recrc=False)) == Errors.CORRUPT_MESSAGE


@pytest.mark.parametrize("count", [0, -1])
def test_records_count_below_one_is_invalid_record(count):
    with pytest.raises(BatchError) as ei:
        split_batches(patch(batch(1), ">i", RECORDS_COUNT, count))
    assert ei.value.code == Errors.INVALID_RECORD
    assert "recordsCount" in ei.value.message


@pytest.mark.parametrize("delta", [0, 1, 3, -1])
def test_last_offset_delta_must_match_records_count(delta):
    with pytest.raises(BatchError) as ei:
        split_batches(patch(batch(3), ">i", LAST_OFFSET_DELTA, delta))
    assert ei.value.code == Errors.INVALID_RECORD
    assert "lastOffsetDelta" in ei.value.message


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_unknown_compression_codec(codec):
    assert code_of(patch(batch(), ">h", ATTRIBUTES, codec)) == Errors.UNSUPPORTED_COMPRESSION_TYPE


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_known_compression_codecs_pass_header_validation(codec):
    [(h, _)] = split_batches(patch(batch(), ">h", ATTRIBUTES, codec))
    assert h.compression == codec


def test_control_batch_from_a_client_is_invalid_record():
    data = patch(batch(1, producer_id=5, producer_epoch=0, base_sequence=0), ">h", ATTRIBUTES, 0x20 | 0x10)
    with pytest.raises(BatchError) as ei:
        split_batches(data)
    assert ei.value.code == Errors.INVALID_RECORD and "control" in ei.value.message


def test_idempotent_batch_needs_sequence_and_epoch():
    good = batch(producer_id=5, producer_epoch=0, base_sequence=0)
    split_batches(good)
    with pytest.raises(BatchError) as ei:
        split_batches(patch(good, ">i", BASE_SEQUENCE, -1))
    assert ei.value.code == Errors.INVALID_RECORD and "baseSequence -1" in ei.value.message
    with pytest.raises(BatchError) as ei:
        split_batches(patch(good, ">h", PRODUCER_EPOCH, -1))
    assert ei.value.code == Errors.INVALID_RECORD and "producerEpoch -1" in ei.value.message


@pytest.mark.parametrize("pid", [-2, -(2**63)])
def test_negative_producer_id_below_minus_one_is_invalid(pid):
    with pytest.raises(BatchError) as ei:
        split_batches(patch(batch(), ">q", PRODUCER_ID, pid))
    assert ei.value.code == Errors.INVALID_RECORD and f"producerId {pid}" in ei.value.message


def test_non_idempotent_batch_may_carry_any_sequence():
    split_batches(batch(producer_id=-1, producer_epoch=-1, base_sequence=-1))
    split_batches(patch(batch(), ">i", BASE_SEQUENCE, 17))


def test_transactional_batch_without_producer_id_is_invalid():
    assert code_of(batch(transactional=True)) == Errors.INVALID_RECORD
    split_batches(batch(transactional=True, producer_id=3, producer_epoch=0, base_sequence=0))


def test_message_too_large():
    data = batch(10)
    split_batches(data, max_batch_bytes=len(data))
    with pytest.raises(BatchError) as ei:
        split_batches(data, max_batch_bytes=len(data) - 1)
    assert ei.value.code == Errors.MESSAGE_TOO_LARGE


def test_bad_batch_after_a_good_one_refuses_the_blob():
    bad = patch(batch(), ">i", RECORDS_COUNT, 0)
    with pytest.raises(BatchError) as ei:
        split_batches(batch() + bad)
    assert ei.value.code == Errors.INVALID_RECORD
    assert f"byte {len(batch())}" in ei.value.message


def test_batch_error_is_retriable_only_for_corruption():
    assert BatchError(Errors.CORRUPT_MESSAGE, "x").retriable
    assert not BatchError(Errors.INVALID_RECORD, "x").retriable


def test_decode_refuses_compressed_and_malformed_records():
    with pytest.raises(BatchError) as ei:
        decode_records(patch(batch(), ">h", ATTRIBUTES, 1))
    assert ei.value.code == Errors.UNSUPPORTED_COMPRESSION_TYPE
    # A records count that the record bytes do not satisfy.
    with pytest.raises(BatchError) as ei:
        decode_records(patch(batch(2), ">i", RECORDS_COUNT, 3))
    assert ei.value.code == Errors.CORRUPT_MESSAGE
    with pytest.raises(BatchError):
        decode_records(patch(batch(2), ">i", RECORDS_COUNT, 1))  # bytes left after the last record


def test_random_garbage_never_raises_anything_but_batch_error():
    rng = random.Random(7)
    good = batch()
    for _ in range(2000):
        data = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        data = bytes(data[:rng.randint(0, len(data))]) if rng.random() < 0.3 else bytes(data)
        try:
            split_batches(data)
        except BatchError:
            pass


# ------------------------------------------------------------------ other encoders

def test_bytes_identical_to_kio_writer():
    when = datetime.datetime.fromtimestamp(1_700_000_000.5, datetime.UTC)
    records = tuple(Record(attributes=i8(0), timestamp=when, offset=i64(i), key=k, value=v, headers=())
                    for i, (k, v) in enumerate([(b"a", b"b"), (None, b"c")]))
    buf = io.BytesIO()
    write_new_batch(buf, NewRecordBatch(producer_id=i64(7), producer_epoch=i16(1), base_sequence=i32(3),
                                        attributes=i16(0), records=records))
    ours = encode_batch([(b"a", b"b"), (None, b"c")], timestamp_ms=1_700_000_000_500, producer_id=7,
                        producer_epoch=1, base_sequence=3, partition_leader_epoch=0)
    assert buf.getvalue() == ours
    parsed, size = read_batch(ours, 0)
    assert size == len(ours) and [r.value for r in parsed.records] == [b"b", b"c"]


def test_kafka_python_client_batches_are_accepted():
    kafka = pytest.importorskip("kafka.record.default_records")
    for codec in (0, 1):  # none, gzip
        b = kafka.DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=False, producer_id=9,
                                            producer_epoch=2, base_sequence=10, batch_size=1 << 20)
        for i in range(3):
            b.append(i, timestamp=TS + i, key=b"k%d" % i, value=b"v" * 50, headers=[("h", b"x")])
        data = bytes(b.build())
        [(h, raw)] = split_batches(data)
        assert (h.producer_id, h.producer_epoch, h.base_sequence, h.last_sequence) == (9, 2, 10, 12)
        assert h.compression == codec and raw == data
        if codec == 0:
            assert decode_records(data) == [(i, TS + i, b"k%d" % i, b"v" * 50) for i in range(3)]
    # and kafka-python reads ours
    ours = with_base_offset(encode_batch([(b"k", b"v"), (None, b"w")], timestamp_ms=TS), 40)
    read = list(kafka.DefaultRecordBatch(ours))
    assert [(r.offset, r.timestamp, r.key, r.value) for r in read] == [(40, TS, b"k", b"v"), (41, TS, None, b"w")]


@pytest.mark.parametrize("magic", [0, 1])
def test_kafka_python_legacy_message_sets_are_unsupported(magic):
    legacy = pytest.importorskip("kafka.record.legacy_records")
    b = legacy.LegacyRecordBatchBuilder(magic=magic, compression_type=0, batch_size=1 << 20)
    b.append(0, timestamp=TS if magic else None, key=b"k", value=b"v")
    assert code_of(bytes(b.build())) == Errors.UNSUPPORTED_FOR_MESSAGE_FORMAT
