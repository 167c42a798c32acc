"""Unit tests for broker.partition.Partition (log + producer state) and broker.storage.Storage."""
from __future__ import annotations

import concurrent.futures
import os
import shutil
import threading

import pytest

from broker import log as logmod
from broker import partition as partition_mod
from broker.log import OffsetOutOfRangeError, segment_name
from broker.partition import EXPIRY_CHECK_MS, AppendResult, Partition
from broker.producer_state import list_snapshots
from broker.recordbatch import decode_all, encode_batch
from broker.storage import InvalidTopicError, Storage, UnknownTopicOrPartitionError, validate_topic_name
from snapshots.storage.disk import CorruptFileError
from records.wire.errors import Errors

TS = 1_700_000_000_000
DAY = 24 * 3600 * 1000


def idem(pid: int, epoch: int, seq: int, n: int = 1, tag: str = "v") -> bytes:
    return encode_batch([(None, f"{tag}{seq + i}".encode()) for i in range(n)], producer_id=pid,
                        producer_epoch=epoch, base_sequence=seq, timestamp_ms=TS)


def plain(*vals: bytes) -> bytes:
    return encode_batch([(None, v) for v in vals], timestamp_ms=TS)


def all_values(p: Partition) -> list[bytes]:
    out, off = [], p.log_start_offset
    while off < p.log_end_offset:
        recs = decode_all(p.read(off, 1 << 20))
        out += [v for o, _, _, v in recs if o >= off]
        off = recs[-1][0] + 1
    return out


class Clock:
    def __init__(self, t: int = TS):
        self.t = t

    def __call__(self) -> int:
        return self.t


@pytest.fixture
def d(tmp_path) -> str:
    return str(tmp_path / "topic-0")


# ------------------------------------------------------------------ appends

def test_plain_appends_get_consecutive_offsets(d):
    with Partition(d) as p:
        r = p.append(plain(b"a", b"b"))
        assert r == AppendResult(Errors.NONE, base_offset=0, log_append_time=-1, log_start_offset=0)
        assert p.append(plain(b"c")).base_offset == 2
        assert p.high_watermark == p.log_end_offset == 3
        assert all_values(p) == [b"a", b"b", b"c"]


def test_retried_batch_is_a_duplicate_answered_with_the_original_offset(d):
    with Partition(d) as p:
        p.append(plain(b"noise", b"noise"))
        first = p.append(idem(7, 0, 0, n=3))
        assert first.ok and first.base_offset == 2
        size = p.log.size_bytes
        retry = p.append(idem(7, 0, 0, n=3))
        assert (retry.error, retry.base_offset, retry.duplicate) == (Errors.NONE, 2, True)
        assert p.log_end_offset == 5 and p.log.size_bytes == size  # nothing appended
        assert p.append(idem(7, 0, 3)).base_offset == 5
        assert all_values(p) == [b"noise", b"noise", b"v0", b"v1", b"v2", b"v3"]


def test_without_dedup_the_retry_is_appended_twice(d):
    with Partition(d, dedup=False) as p:
        assert p.append(idem(7, 0, 0, n=2)).base_offset == 0
        retry = p.append(idem(7, 0, 0, n=2))
        assert (retry.error, retry.base_offset, retry.duplicate) == (Errors.NONE, 2, False)
        assert all_values(p) == [b"v0", b"v1", b"v0", b"v1"]
        # and no sequence checks either
        assert p.append(idem(7, 0, 40)).ok and p.append(idem(7, 0, 5)).ok


def test_out_of_order_and_fenced_batches_are_refused_and_not_appended(d):
    with Partition(d) as p:
        p.append(idem(1, 3, 0))
        gap = p.append(idem(1, 3, 2))
        assert gap.error == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER and gap.base_offset == -1 and "expected 1" in gap.message
        fenced = p.append(idem(1, 2, 1))
        assert fenced.error == Errors.INVALID_PRODUCER_EPOCH
        assert p.log_end_offset == 1
        assert p.append(idem(1, 3, 1)).ok


def test_all_or_nothing_on_a_sequence_error_later_in_the_request(d):
    with Partition(d) as p:
        r = p.append(idem(1, 0, 0) + plain(b"x") + idem(1, 0, 5))
        assert r.error == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert p.log_end_offset == 0 and p.producers() == {}
        assert p.append(idem(1, 0, 0)).ok  # sequence 0 is still what comes next


def test_all_or_nothing_on_a_corrupt_batch_later_in_the_request(d):
    bad = bytearray(plain(b"x"))
    bad[-1] ^= 1
    with Partition(d) as p:
        r = p.append(idem(1, 0, 0) + bytes(bad))
        assert r.error == Errors.CORRUPT_MESSAGE and "CRC" in r.message
        assert p.log_end_offset == 0 and p.producers() == {}


@pytest.mark.parametrize("blob, code", [
    (b"", Errors.INVALID_RECORD),
    (b"\xff" * 30, Errors.CORRUPT_MESSAGE),
    (b"\x00" * 30, Errors.UNSUPPORTED_FOR_MESSAGE_FORMAT),  # magic 0
    (plain(b"x")[:-1], Errors.CORRUPT_MESSAGE),
])
def test_invalid_blobs_append_nothing(d, blob, code):
    with Partition(d) as p:
        assert p.append(blob).error == code
        assert p.log_end_offset == 0


def test_message_too_large(d):
    big = plain(b"x" * 2000)
    with Partition(d, max_batch_bytes=1000) as p:
        assert p.append(big).error == Errors.MESSAGE_TOO_LARGE
        assert p.append(plain(b"small")).ok


def test_request_of_duplicates_only_answers_the_first_duplicate(d):
    with Partition(d) as p:
        p.append(idem(1, 0, 0))
        p.append(idem(1, 0, 1))
        r = p.append(idem(1, 0, 0) + idem(1, 0, 1))
        assert (r.error, r.base_offset, r.duplicate) == (Errors.NONE, 0, True)
        assert p.log_end_offset == 2


def test_duplicate_then_new_batch_appends_only_the_new_one(d):
    with Partition(d) as p:
        p.append(idem(1, 0, 0))
        r = p.append(idem(1, 0, 0) + idem(1, 0, 1))
        assert (r.error, r.base_offset, r.duplicate) == (Errors.NONE, 0, False)
        assert all_values(p) == [b"v0", b"v1"]


def test_duplicate_inside_one_request_is_appended_once(d):
    with Partition(d) as p:
        r = p.append(plain(b"x") + idem(1, 0, 0) + idem(1, 0, 0))
        assert r.ok and r.base_offset == 0
        assert all_values(p) == [b"x", b"v0"]
        assert p.append(idem(1, 0, 0)).base_offset == 1


def test_storage_error_answers_unknown_server_error_and_keeps_state(d, monkeypatch):
    with Partition(d) as p:
        p.append(idem(1, 0, 0))

        def full(*a):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(logmod.os, "pwrite", full)
        r = p.append(idem(1, 0, 1))
        assert r.error == Errors.UNKNOWN_SERVER_ERROR and "No space" in r.message
        monkeypatch.undo()
        assert p.log_end_offset == 1
        assert p.append(idem(1, 0, 1)).base_offset == 1  # not taken for a duplicate


# ------------------------------------------------------------------ restart, retention, expiry

def test_duplicates_detected_after_a_clean_restart(d):
    with Partition(d) as p:
        p.append(idem(1, 0, 0, n=2))
        p.append(idem(1, 0, 2))
    assert [o for o, _ in list_snapshots(d)] == [3]
    with Partition(d) as p:
        assert p.producers()[1].last_seq == 2
        r = p.append(idem(1, 0, 0, n=2))
        assert r.duplicate and r.base_offset == 0
        assert p.append(idem(1, 0, 4)).error == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_duplicates_detected_after_a_crash_without_close(d):
    p = Partition(d)
    p.append(idem(1, 0, 0))
    p.append(idem(1, 0, 1))
    # no close(): no snapshot; the state comes back from the log
    assert list_snapshots(d) == []
    with Partition(d) as q:
        assert q.state.recovery_stats["replayed_batches"] == 2
        assert q.append(idem(1, 0, 1)).base_offset == 1
    p.log.close()


def test_periodic_snapshots(d):
    with Partition(d, snapshot_every=3) as p:
        for seq in range(7):
            p.append(idem(1, 0, seq))
            p.wait_snapshots()
        assert [o for o, _ in list_snapshots(d)] == [3, 6]


def test_retention_deletes_segments_but_keeps_producer_state(d):
    one = len(idem(1, 0, 0))
    with Partition(d, segment_bytes=2 * one, retention_bytes=2 * one) as p:
        for seq in range(8):
            assert p.append(idem(1, 0, seq)).ok
        p.wait_snapshots()  # segments go once a snapshot covering them is durable
        assert p.log_start_offset >= 4
        assert p.log.segment_base_offsets[0] == p.log_start_offset
        assert not os.path.exists(os.path.join(d, segment_name(0)))
        with pytest.raises(OffsetOutOfRangeError):
            p.read(0, 100)
        r = p.append(idem(1, 0, 4))  # its segment is gone, the state is not
        assert r.duplicate and r.base_offset == 4
        assert r.log_start_offset == p.log_start_offset
    with Partition(d, segment_bytes=2 * one, retention_bytes=2 * one) as p:
        r = p.append(idem(1, 0, 3))
        assert r.duplicate and r.base_offset == 3


def test_delete_records_before_snapshots_first(d):
    one = len(idem(1, 0, 0))
    p = Partition(d, segment_bytes=one)
    for seq in range(4):
        p.append(idem(1, 0, seq))
    assert p.delete_records_before(4) == 4
    p.log.close()  # crash: no close-time snapshot
    with Partition(d, segment_bytes=one) as q:
        assert q.log_start_offset == 4
        assert q.append(idem(1, 0, 2)).base_offset == 2


def test_idle_producers_expire(d):
    clock = Clock()
    with Partition(d, clock_ms=clock, producer_id_expiration_ms=DAY) as p:
        p.append(idem(1, 0, 0))
        p.append(idem(2, 0, 0))
        clock.t += DAY - 1
        p.append(idem(2, 0, 1))
        assert set(p.producers()) == {1, 2}
        clock.t += 1
        p.append(plain(b"tick"))  # appends check expiry, at most once a minute: not yet
        assert set(p.producers()) == {1, 2}
        clock.t += EXPIRY_CHECK_MS
        p.append(plain(b"tick"))
        assert set(p.producers()) == {2}
        clock.t += DAY
        p.append(plain(b"tick"))
        assert set(p.producers()) == set()
        # the expired producer's retry is no longer recognised: appended again (Kafka alike)
        assert p.append(idem(1, 0, 0)).base_offset == 6
        assert p.append(idem(2, 0, 1)).base_offset == 7  # so is the other's


def test_expiry_applies_on_open(d):
    clock = Clock()
    with Partition(d, clock_ms=clock) as p:
        p.append(idem(1, 0, 0))
    clock.t += 2 * DAY
    with Partition(d, clock_ms=clock) as p:
        assert p.producers() == {}


def test_offset_for_timestamp_and_read(d):
    with Partition(d) as p:
        p.append(encode_batch([(None, b"a"), (None, b"b")], timestamps=[10, 20]))
        assert p.offset_for_timestamp(15) == (1, 20)
        assert p.offset_for_timestamp(-1) == (2, -1)
        assert p.read(2, 100) == b""
        with pytest.raises(OffsetOutOfRangeError):
            p.read(3, 100)


def test_concurrent_appends_from_threads(d):
    with Partition(d, fsync=False) as p:
        def worker(pid):
            for seq in range(50):
                assert p.append(idem(pid, 0, seq)).ok

        threads = [threading.Thread(target=worker, args=(pid,)) for pid in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert p.log_end_offset == 200
        assert {pid: e.last_seq for pid, e in p.producers().items()} == {0: 49, 1: 49, 2: 49, 3: 49}


def test_closed_partition_refuses_calls(d):
    p = Partition(d)
    p.close()
    with pytest.raises(ValueError):
        p.append(plain(b"x"))


# ------------------------------------------------------------------ storage

@pytest.mark.parametrize("name", ["a", "topic.name_x-1", "A" * 249, "..."])
def test_legal_topic_names(name):
    validate_topic_name(name)


@pytest.mark.parametrize("name", ["", ".", "..", "A" * 250, "a b", "a/b", "é", "a\x00", None, 5])
def test_illegal_topic_names(name):
    with pytest.raises(InvalidTopicError) as ei:
        validate_topic_name(name)
    assert ei.value.code == Errors.INVALID_TOPIC_EXCEPTION


def test_topics_are_created_on_first_use_and_reopened(tmp_path):
    root = str(tmp_path / "data")
    with Storage(root, default_partitions=3) as s:
        assert s.topics() == []
        p = s.partition("orders", 2)
        assert p.append(plain(b"x")).ok
        info = s.topic("orders")
        assert info.partitions == 3
        assert sorted(os.listdir(root)) == ["orders-0", "orders-1", "orders-2", "orders.topic"]
        assert s.ensure_topic("orders", partitions=10) == info  # the count never changes
        s.ensure_topic("audit", partitions=1)
        with pytest.raises(UnknownTopicOrPartitionError) as ei:
            s.partition("orders", 3)
        assert ei.value.code == Errors.UNKNOWN_TOPIC_OR_PARTITION
        with pytest.raises(InvalidTopicError):
            s.partition("bad name", 0)
    with Storage(root) as s:
        assert [(t.name, t.partitions) for t in s.topics()] == [("audit", 1), ("orders", 3)]
        assert s.topic("orders").topic_id == info.topic_id
        assert all_values(s.partition("orders", 2)) == [b"x"]


def test_no_auto_create(tmp_path):
    with Storage(str(tmp_path), auto_create=False) as s:
        with pytest.raises(UnknownTopicOrPartitionError):
            s.partition("t", 0)
        s.ensure_topic("t")
        assert s.partition("t", 0).log_end_offset == 0


def test_partition_options_reach_every_partition(tmp_path):
    with Storage(str(tmp_path), dedup=False) as s:
        p = s.partition("t", 0)
        p.append(idem(1, 0, 0))
        assert p.append(idem(1, 0, 0)).base_offset == 1


def test_missing_partition_directory_is_refused(tmp_path):
    root = str(tmp_path)
    with Storage(root, default_partitions=2) as s:
        s.partition("t", 0).append(plain(b"x"))
    shutil.rmtree(os.path.join(root, "t-1"))
    with pytest.raises(CorruptFileError) as ei:
        Storage(root)
    assert ei.value.path == os.path.join(root, "t.topic") and "t-1" in str(ei.value)


def test_corrupt_topic_metadata_is_refused(tmp_path):
    root = str(tmp_path)
    with Storage(root) as s:
        s.ensure_topic("t")
    path = os.path.join(root, "t.topic")
    data = bytearray(open(path, "rb").read())
    data[-5] ^= 1
    open(path, "wb").write(data)
    with pytest.raises(CorruptFileError) as ei:
        Storage(root)
    assert ei.value.path == path


def test_topic_creation_cut_by_a_crash_is_finished_later(tmp_path, caplog):
    root = str(tmp_path)
    Partition(os.path.join(root, "t-0")).close()  # the directories came, the metadata did not
    with Storage(root, default_partitions=2) as s:
        assert "belongs to no topic" in caplog.text
        assert s.topics() == []
        assert s.partition("t", 1).append(plain(b"x")).ok
    with Storage(root) as s:
        assert s.topic("t").partitions == 2


def test_damaged_partition_refuses_the_storage(tmp_path):
    root = str(tmp_path)
    with Storage(root) as s:
        p = s.partition("t", 0)
        for v in (b"a", b"b", b"c"):
            p.append(plain(v))
    seg = os.path.join(root, "t-0", segment_name(0))
    data = bytearray(open(seg, "rb").read())
    data[70] ^= 1
    open(seg, "wb").write(data)
    with pytest.raises(CorruptFileError) as ei:
        Storage(root)
    assert ei.value.path == seg


# ------------------------------------------------------------------ producer state at scale

def test_maintain_expires_idle_producers_of_a_partition_nobody_writes_to(d):
    clock = Clock()
    with Partition(d, clock_ms=clock, producer_id_expiration_ms=DAY) as p:
        for pid in range(3):
            p.append(idem(pid, 0, 0))
        clock.t += DAY + EXPIRY_CHECK_MS
        p.maintain()
        assert p.producers() == {}


def test_an_expiry_pass_is_done_a_chunk_per_append(d, monkeypatch):
    monkeypatch.setattr(partition_mod, "EXPIRY_CHUNK_ROWS", 4)
    clock = Clock()
    with Partition(d, clock_ms=clock, producer_id_expiration_ms=DAY) as p:
        p.append(b"".join(idem(pid, 0, 0) for pid in range(10)))
        clock.t += DAY + EXPIRY_CHECK_MS
        p.append(plain(b"tick"))  # starts the pass: rows 0-3
        assert len(p.producers()) == 6
        p.append(plain(b"tick"))
        assert len(p.producers()) == 2
        p.append(plain(b"tick"))
        assert p.producers() == {}


class InlineExecutor:
    """Runs a snapshot write at once, in the caller; fails while ``fail`` is set."""

    def __init__(self):
        self.fail = False
        self.calls = 0

    def submit(self, fn, *args):
        self.calls += 1
        f = concurrent.futures.Future()
        if self.fail:
            f.set_exception(OSError(28, "No space left on device"))
        else:
            f.set_result(fn(*args))
        return f


def test_segments_go_only_below_a_durable_snapshot(d):
    one = len(idem(1, 0, 0))
    ex = InlineExecutor()
    ex.fail = True
    with Partition(d, segment_bytes=2 * one, retention_bytes=2 * one, snapshot_executor=ex) as p:
        for seq in range(8):
            assert p.append(idem(1, 0, seq)).ok  # appends go on: the log holds what a snapshot would
        assert ex.calls and p.snapshot_errors == ex.calls
        assert p.log_start_offset == 0 and list_snapshots(d) == []
        ex.fail = False
        assert p.append(idem(1, 0, 8)).ok
        assert p.log_start_offset >= 4
        assert p.append(idem(1, 0, 2)).error == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER  # the state was kept
    with Partition(d, segment_bytes=2 * one, retention_bytes=2 * one) as q:
        assert q.append(idem(1, 0, 8)).duplicate


def test_appends_do_not_wait_for_a_snapshot_being_written(d):
    started, release = threading.Event(), threading.Event()

    class Slow:
        def submit(self, fn, *args):
            f = concurrent.futures.Future()

            def run():
                started.set()
                release.wait(10)
                f.set_result(fn(*args))
            threading.Thread(target=run, daemon=True).start()
            return f

    with Partition(d, snapshot_every=2, snapshot_executor=Slow()) as p:
        p.append(idem(1, 0, 0))
        p.append(idem(1, 0, 1))
        assert started.wait(10)
        for seq in range(2, 50):  # the snapshot thread is stuck; appends go on
            assert p.append(idem(1, 0, seq)).ok
        release.set()
        p.wait_snapshots(10)
        assert [o for o, _ in list_snapshots(d)][-1] >= 2


def test_a_transactional_batch_outside_a_transaction_is_refused_and_not_appended(d):
    """KIP-890 part 1: without the front end's word that the coordinator added the partition to the
    producer's transaction (``transactional_ok``), a transactional batch is refused."""
    txn = encode_batch([(None, b"t")], producer_id=7, producer_epoch=0, base_sequence=0, timestamp_ms=TS,
                       transactional=True)
    with Partition(d) as p:
        r = p.append(plain(b"a") + txn)
        assert r.error == Errors.INVALID_TXN_STATE and "transaction" in r.message
        assert p.log_end_offset == 0 and p.producers() == {}
        assert p.append(plain(b"a")).ok
