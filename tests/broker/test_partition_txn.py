"""The partition side of Kafka transactions (KIP-98): transactional appends, end markers, the last stable
offset, the aborted-transaction index, and their survival across restarts and crashes."""
from __future__ import annotations

import struct

import msgpack
import numpy as np
import pytest

from broker.producer_state import ABORTED, AbortedIndex, ProducerStateManager, read_snapshot, snapshot_path
from broker.recordbatch import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    HEADER_SIZE,
    BatchError,
    control_record_type,
    encode_batch,
    encode_control_batch,
    iter_records,
    parse_header,
    split_batches,
)
from storage.disk import CorruptFileError
from tests.broker.test_partition import TS
from tests.broker.test_producer_state import _forge


def txn(pid: int, epoch: int, seq: int, n: int = 1, tag: str = "t") -> bytes:
    return encode_batch([(None, f"{tag}{pid}-{seq + i}".encode()) for i in range(n)], producer_id=pid,
                        producer_epoch=epoch, base_sequence=seq, timestamp_ms=TS, transactional=True)


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


# ------------------------------------------------------------------ the state

def test_aborted_index_grows_truncates_and_inserts_in_order():
    ix = AbortedIndex()
    for k in range(100):
        assert ix.add(k, 10 * k, 10 * k + 5, 10 * k + 6)
    assert len(ix) == 100 and not ix.add(3, 30, 35, 36)  # held already
    assert ix.truncate_before(500) == 50 and len(ix) == 50
    assert ix.collect(0, 10_000)[0] == (50, 500)
    for k in range(100, 300):  # grows past what the truncation freed
        ix.add(k, 10 * k, 10 * k + 5, 10 * k + 6)
    assert len(ix) == 250 and list(ix.entries()["last"]) == sorted(ix.entries()["last"])
    assert ix.add(1000, 2001, 2002, 2003)  # a replay's out-of-order insert keeps marker order
    assert list(ix.entries()["last"]) == sorted(ix.entries()["last"])
    assert (1000, 2001) in ix.collect(2001, 2003)
    assert ix.truncate_before(10**9) == 251 and len(ix) == 0 and ix.collect(0, 10**9) == []


@pytest.mark.parametrize("change", ["ongoing-past-end", "ongoing-unsorted", "ongoing-twice", "aborted-past-end",
                                    "aborted-unsorted", "aborted-first-after-last", "aborted-count",
                                    "aborted-layout", "ongoing-not-list", "marker-row-past-end"])
def test_a_snapshot_with_transactions_out_of_range_is_refused(tmp_path, change):
    m = ProducerStateManager()
    path = str(tmp_path / "s.snapshot")
    m.update(parse_header(txn(1, 0, 0)), 0, TS)
    m.update(parse_header(txn(2, 0, 0)), 1, TS)
    m.end_transaction(1, 0, False, 2, TS)
    m.update(parse_header(txn(3, 0, 0)), 3, TS)
    m.end_transaction(3, 1, False, 4, TS)  # a marker row for producer 3
    m.update(parse_header(txn(4, 0, 0)), 5, TS)
    m.write_snapshot(path, 6)
    obj = msgpack.unpackb(open(path, "rb").read()[12:-4], raw=False)
    assert obj["format"] == 3 and obj["ongoing"] == [[2, 0, 1], [4, 0, 5]] and obj["aborted_count"] == 2
    aborted = np.frombuffer(obj["aborted"], ABORTED).copy()
    if change == "ongoing-past-end":
        obj["ongoing"][1][2] = 6
    elif change == "ongoing-unsorted":
        obj["ongoing"].reverse()
    elif change == "ongoing-twice":
        obj["ongoing"][1][0] = 2
    elif change == "aborted-past-end":
        aborted["last"][1] = 6
    elif change == "aborted-unsorted":
        aborted = aborted[::-1].copy()
    elif change == "aborted-first-after-last":
        aborted["first"][0] = 2
    elif change == "aborted-count":
        obj["aborted_count"] = 3
    elif change == "aborted-layout":
        obj["aborted_row"] = "[('last', '<i8')]"
    elif change == "ongoing-not-list":
        obj["ongoing"] = {"2": 1}
    else:
        obj["end"] = obj["offset"] = 4  # producer 3's marker row (offset 4) and others lie past it
        obj["ongoing"], obj["aborted_count"], aborted = [], 0, aborted[:0]
    obj["aborted"] = aborted.tobytes()
    _forge(path, obj)
    with pytest.raises(CorruptFileError):
        read_snapshot(path)


def test_a_snapshot_file_round_trips_the_transactions(tmp_path):
    m = ProducerStateManager()
    m.update(parse_header(txn(1, 0, 0)), 0, TS)
    m.update(parse_header(txn(2, 0, 0)), 1, TS)
    m.end_transaction(1, 0, False, 2, TS)
    path = snapshot_path(str(tmp_path), 3)
    m.write_snapshot(path, 3)
    r = ProducerStateManager()
    assert r.load_snapshot(path) == 3
    assert r.ongoing() == {2: (0, 1)} and r.aborted_transactions(0, 3) == [(1, 0)]
    assert r.first_unstable_offset() == 1
