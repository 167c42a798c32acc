"""The partition side of Kafka transactions (KIP-98): the control batch, transactional appends and end
markers.  Reads (the last stable offset, the aborted-transaction index), restarts, crashes and bounds are
in test_partition_txn_recovery."""
from __future__ import annotations

import struct

import pytest

from broker.partition import Partition
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
from tests.broker.test_partition import TS, idem, plain
from records.wire.errors import Errors
from tests.broker.txn_batches import txn
from tests.broker.txn_batches import d  # noqa: F401 (a fixture)


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


def test_a_client_may_not_produce_a_control_batch(d):
    with Partition(d) as p:
        r = p.append(encode_control_batch(7, 0, True, timestamp_ms=TS), transactional_ok=True)
        assert r.error == Errors.INVALID_RECORD and p.log_end_offset == 0
    with pytest.raises(BatchError):
        split_batches(encode_control_batch(7, 0, True, timestamp_ms=TS))


# ------------------------------------------------------------------ appends

def test_a_transactional_batch_needs_the_front_ends_word(d):
    with Partition(d) as p:
        r = p.append(txn(7, 0, 0))
        assert r.error == Errors.INVALID_TXN_STATE and p.log_end_offset == 0 and p.producers() == {}
        assert p.ongoing_transactions() == {}
        assert p.append(txn(7, 0, 0), transactional_ok=True).ok
        assert p.ongoing_transactions() == {7: (0, 0)}


def test_commit_flow(d):
    with Partition(d) as p:
        assert p.append(plain(b"a")).base_offset == 0
        assert p.append(txn(7, 0, 0, n=2), transactional_ok=True).base_offset == 1
        assert p.append(plain(b"b")).ok  # other producers go on meanwhile
        assert p.append(txn(7, 0, 2), transactional_ok=True).base_offset == 4
        assert p.ongoing_transactions() == {7: (0, 1)}  # started by the first batch, kept by the next
        assert p.last_stable_offset == 1 and p.high_watermark == 5
        assert p.describe_producers(10) == ([(7, 0, 2, TS, 1)], 1)
        r = p.write_marker(7, 0, commit=True, coordinator_epoch=4)
        assert (r.error, r.base_offset, r.duplicate) == (Errors.NONE, 5, False)
        assert p.ongoing_transactions() == {} and p.last_stable_offset == p.log_end_offset == 6
        assert p.aborted_transactions(0, 6) == []
        assert p.describe_producers(10)[0][0][4] == -1
        marker = p.read(5, 1 << 20)
        assert parse_header(marker).attributes == 0x30
        assert struct.unpack(">hi", list(iter_records(marker))[0].value) == (0, 4)
        assert p.producer_stats()["ongoing_transactions"] == 0


def test_abort_flow(d):
    with Partition(d) as p:
        p.append(txn(7, 0, 0), transactional_ok=True)  # 0
        p.append(txn(8, 0, 0), transactional_ok=True)  # 1
        p.append(plain(b"x"))  # 2
        assert p.last_stable_offset == 0
        assert p.write_marker(7, 0, commit=False).base_offset == 3
        assert p.last_stable_offset == 1  # producer 8's transaction is still open
        assert p.aborted_transactions(0, 4) == [(7, 0)]
        assert p.write_marker(8, 0, commit=True).base_offset == 4
        assert p.last_stable_offset == 5
        assert p.aborted_transactions(0, 5) == [(7, 0)]
        assert p.producer_stats()["aborted_transactions"] == 1
        # the next transaction of producer 7 starts afresh, at its own first offset
        assert p.append(txn(7, 0, 1), transactional_ok=True).base_offset == 5
        assert p.ongoing_transactions() == {7: (0, 5)}


def test_a_non_transactional_batch_from_a_producer_in_a_transaction_is_refused(d):
    with Partition(d) as p:
        p.append(txn(7, 0, 0), transactional_ok=True)
        r = p.append(idem(7, 0, 1))
        assert r.error == Errors.INVALID_TXN_STATE and "ongoing" in r.message
        # also when the transaction starts earlier in the same request
        r = p.append(txn(9, 0, 0) + idem(9, 0, 1), transactional_ok=True)
        assert r.error == Errors.INVALID_TXN_STATE and p.log_end_offset == 1
        assert p.append(plain(b"x")).ok and p.append(idem(8, 0, 0)).ok  # other producers are not concerned
        # a retry of the transactional batch is still a duplicate
        dup = p.append(txn(7, 0, 0), transactional_ok=True)
        assert dup.duplicate and dup.base_offset == 0
        p.write_marker(7, 0, True)
        assert p.append(idem(7, 0, 1)).ok  # once it ended


def test_dedup_off_still_tracks_transactions(d):
    with Partition(d, dedup=False) as p:
        p.append(txn(7, 0, 0), transactional_ok=True)
        assert p.append(idem(7, 0, 1)).error == Errors.INVALID_TXN_STATE
        assert p.last_stable_offset == 0
        p.write_marker(7, 0, False)
        assert p.aborted_transactions(0, 10) == [(7, 0)]


def test_a_newer_epoch_inside_a_transaction_keeps_its_first_offset(d):
    with Partition(d) as p:
        p.append(txn(7, 0, 0), transactional_ok=True)
        assert p.append(txn(7, 1, 0), transactional_ok=True).ok
        assert p.ongoing_transactions() == {7: (1, 0)}
        assert p.write_marker(7, 0, True).error == Errors.INVALID_PRODUCER_EPOCH


# ------------------------------------------------------------------ markers

def test_a_marker_of_an_older_epoch_is_refused_and_writes_nothing(d):
    with Partition(d) as p:
        p.append(txn(7, 2, 0), transactional_ok=True)
        r = p.write_marker(7, 1, commit=True)
        assert r.error == Errors.INVALID_PRODUCER_EPOCH and p.log_end_offset == 1
        assert p.ongoing_transactions() == {7: (2, 0)}


def test_a_marker_with_a_bumped_epoch_fences_the_older_one(d):
    with Partition(d) as p:
        p.append(txn(7, 0, 0), transactional_ok=True)
        p.append(txn(7, 0, 1), transactional_ok=True)
        r = p.write_marker(7, 1, commit=False)  # the coordinator aborts a timed-out transaction
        assert r.ok and r.base_offset == 2 and parse_header(p.read(2, 100)).producer_epoch == 1
        assert p.aborted_transactions(0, 3) == [(7, 0)]
        assert p.append(txn(7, 0, 2), transactional_ok=True).error == Errors.INVALID_PRODUCER_EPOCH
        assert p.append(txn(7, 0, 1), transactional_ok=True).error == Errors.INVALID_PRODUCER_EPOCH  # even a retry
        assert p.append(txn(7, 1, 3), transactional_ok=True).error == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER
        (row,), _ = p.describe_producers(1)
        assert (row[:3], row[4]) == ((7, 1, -1), -1)  # the new epoch, no sequence yet, no transaction
        assert p.append(txn(7, 1, 0), transactional_ok=True).base_offset == 3
        assert p.ongoing_transactions() == {7: (1, 3)}
        dup = p.append(txn(7, 1, 0), transactional_ok=True)
        assert dup.duplicate and dup.base_offset == 3


def test_a_commit_of_the_same_epoch_keeps_the_retry_cache(d):
    """A batch acknowledged before the marker, whose answer was lost, is still answered as a duplicate."""
    with Partition(d) as p:
        p.append(txn(7, 0, 0, n=2), transactional_ok=True)
        p.append(txn(7, 0, 2), transactional_ok=True)
        p.write_marker(7, 0, True)
        for seq, base in ((0, 0), (2, 2)):
            r = p.append(txn(7, 0, seq, n=2 if seq == 0 else 1), transactional_ok=True)
            assert r.duplicate and r.base_offset == base
        assert p.ongoing_transactions() == {}  # a duplicate starts nothing
        assert p.append(txn(7, 0, 3), transactional_ok=True).base_offset == 4


def test_a_retried_marker_writes_nothing(d):
    with Partition(d) as p:
        p.append(txn(7, 0, 0), transactional_ok=True)
        assert p.write_marker(7, 0, False).base_offset == 1
        end = p.log_end_offset
        for commit in (False, True):  # a coordinator that restarted sends it again
            r = p.write_marker(7, 0, commit)
            assert (r.error, r.duplicate, r.base_offset) == (Errors.NONE, True, -1)
        assert p.log_end_offset == end and p.aborted_transactions(0, end) == [(7, 0)]
        # a partition added to a transaction that sent it nothing: no producer state, nothing written
        r = p.write_marker(99, 0, True)
        assert r.ok and r.duplicate and p.log_end_offset == end and 99 not in p.producers()


def test_a_marker_for_a_transaction_that_ended_writes_nothing_into_the_next(d):
    """The coordinator's word, asked under the partition's lock: the producer's transaction here is a later
    one than the marker's (a completion working from a late answer): nothing is written, nothing ended."""
    with Partition(d) as p:
        p.append(txn(7, 0, 0), transactional_ok=True)
        asked = []
        r = p.write_marker(7, 0, True, still_current=lambda: asked.append(1) or False)
        assert asked == [1] and (r.error, r.duplicate) == (Errors.NONE, True)
        assert p.ongoing_transactions() == {7: (0, 0)} and p.last_stable_offset == 0
        assert p.write_marker(7, 0, False, still_current=lambda: True).base_offset == 1  # its own end
        assert p.aborted_transactions(0, p.log_end_offset) == [(7, 0)]


def test_an_epoch_bump_without_a_transaction_is_written_once(d):
    """Writing nothing would lose the bump at the next crash: the marker goes to the log (as Kafka
    writes it); its retry is then a duplicate."""
    with Partition(d) as p:
        p.append(idem(7, 0, 0))
        r = p.write_marker(7, 1, False)
        assert r.ok and not r.duplicate and r.base_offset == 1
        assert p.aborted_transactions(0, 2) == []  # there was no transaction to abort
        assert p.write_marker(7, 1, False).duplicate and p.log_end_offset == 2
        assert p.append(idem(7, 0, 1)).error == Errors.INVALID_PRODUCER_EPOCH
        assert p.last_stable_offset == 2
