"""The partition side of Kafka transactions (KIP-98): transactional appends, end markers, the last stable
offset, the aborted-transaction index, and their survival across restarts and crashes."""
from __future__ import annotations

import struct

import pytest

from broker.recordbatch import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    HEADER_SIZE,
    BatchError,
    control_record_type,
    encode_control_batch,
    iter_records,
    parse_header,
    split_batches,
)
from tests.broker.test_partition import TS


# ------------------------------------------------------------------ the control batch

def test_a_control_batch_has_kafkas_layout():
    b = encode_control_batch(42, 3, True, 17, timestamp_ms=TS)
    h = parse_header(b)
    assert (h.attributes, h.magic, h.producer_id, h.producer_epoch, h.base_sequence) == (0x30, 2, 42, 3, -1)
    assert (h.records_count, h.last_offset_delta, h.base_timestamp, h.max_timestamp) == (1, 0, TS, TS)
    assert h.is_control and h.is_transactional and h.timestamp_type == 0 and h.compression == 0
    (rec,) = list(iter_records(b))
    assert struct.unpack(">hh", rec.key) == (0, 1)  # version 0, COMMIT
    assert struct.unpack(">hi", rec.value) == (0, 17)  # version 0, coordinator epoch
    assert rec.headers == () and rec.offset == 0 and rec.timestamp == TS
    abort = encode_control_batch(42, 3, False, timestamp_ms=TS)
    assert struct.unpack(">hh", list(iter_records(abort))[0].key) == (0, 0)
    assert control_record_type(b) == CONTROL_COMMIT and control_record_type(abort) == CONTROL_ABORT
    # the record is Kafka's fixed-size one: length 16 | attributes | ts delta | offset delta | key 4 | value 6 | 0 headers
    assert b[HEADER_SIZE:] == bytes([0x20, 0, 0, 0, 8]) + rec.key + bytes([12]) + rec.value + bytes([0])


def test_a_client_reads_the_control_batch_as_a_control_batch():
    kafka_records = pytest.importorskip("kafka.record.default_records")
    for commit in (True, False):
        b = encode_control_batch(42, 3, commit, 9, timestamp_ms=TS, base_offset=100)
        batch = kafka_records.DefaultRecordBatch(b)
        assert batch.validate_crc()
        assert batch.is_control_batch and batch.is_transactional
        assert (batch.producer_id, batch.producer_epoch, batch.base_sequence, batch.base_offset) == (42, 3, -1, 100)
        (rec,) = list(batch)
        assert isinstance(rec, kafka_records.ControlRecord)
        assert (rec.version, rec.commit, rec.abort, rec.offset) == (0, commit, not commit, 100)


def test_a_client_may_not_produce_a_control_batch():
    with pytest.raises(BatchError):
        split_batches(encode_control_batch(7, 0, True, timestamp_ms=TS))
