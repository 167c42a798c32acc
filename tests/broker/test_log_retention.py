"""broker.log.PartitionLog deleting: records before an offset, retention by bytes and by time, and the
bounded cache of open segment files.  Real files in tmp_path."""
from __future__ import annotations

import os
import threading

import pytest

from broker.log import OffsetOutOfRangeError, PartitionLog, SegmentFiles, segment_name
from tests.broker.log_batches import b, second_write_fails, values


# ------------------------------------------------------------------ deletion and retention

def test_delete_records_before_mid_segment(d):
    one = len(b(1))
    with PartitionLog(d, segment_bytes=2 * one) as lg:
        lg.append([b(1, str(i)) for i in range(6)])
        assert lg.delete_records_before(3) == 3
        assert lg.log_start_offset == 3 and lg.segment_base_offsets == [2, 4]
        assert not os.path.exists(os.path.join(d, segment_name(0)))
        with pytest.raises(OffsetOutOfRangeError):
            lg.read(2, 100)
        assert values(lg.read(3, 100))[0][0] == 3
        assert lg.delete_records_before(1) == 3  # never moves down
        with pytest.raises(OffsetOutOfRangeError):
            lg.delete_records_before(7)
    with PartitionLog(d, segment_bytes=2 * one) as lg:
        assert (lg.log_start_offset, lg.log_end_offset) == (3, 6)


def test_delete_everything_keeps_the_active_segment_and_the_end(d):
    with PartitionLog(d) as lg:
        lg.append([b(4)])
        lg.delete_records_before(4)
        assert (lg.log_start_offset, lg.log_end_offset) == (4, 4)
        assert lg.read(4, 100) == b""
        assert lg.append([b(1)]) == 4
    with PartitionLog(d) as lg:
        assert (lg.log_start_offset, lg.log_end_offset) == (4, 5)


def test_interrupted_deletion_finishes_on_open(d):
    one = len(b(1))
    with PartitionLog(d, segment_bytes=one) as lg:
        lg.append([b(1) for _ in range(4)])
        lg._store_log_start(3)  # the crash came after the start was stored, before any file went
    with PartitionLog(d, segment_bytes=one) as lg:
        assert lg.log_start_offset == 3 and lg.segment_base_offsets == [3]


def test_retention_by_bytes_deletes_whole_old_segments(d):
    one = len(b(1))
    with PartitionLog(d, segment_bytes=2 * one) as lg:
        lg.append([b(1) for _ in range(9)])  # segments 0,2,4,6 full, 8 active
        assert lg.plan_retention(10**9) == 0
        assert lg.plan_retention(5 * one) == 4  # keeps >= 5 batches' worth: segments 4,6,8
        assert lg.log_start_offset == 0  # planning deletes nothing
        assert lg.delete_records_before(lg.plan_retention(5 * one)) == 4  # as Partition enforces it
        assert lg.segment_base_offsets == [4, 6, 8] and lg.size_bytes == 5 * one
        assert lg.delete_records_before(lg.plan_retention(0)) == 8  # never the active segment
        assert lg.segment_base_offsets == [8]


# ------------------------------------------------------------------ retention by time

def _one_batch_segments(d: str, timestamps, **kw) -> PartitionLog:
    """A log with one batch per segment (the last one active), each with the given max timestamp."""
    one = len(b(1))
    lg = PartitionLog(d, segment_bytes=one, **kw)
    lg.append([b(1, ts=t) for t in timestamps])
    assert lg.segment_base_offsets == list(range(len(timestamps)))
    return lg


def test_retention_by_time_deletes_segments_whose_newest_record_is_too_old(d):
    with _one_batch_segments(d, [100, 200, 300, 400, 500]) as lg:
        assert lg.plan_retention(None, 250, now_ms=500) == 2  # 100 and 200 are more than 250 ms old; 300 is not
        assert lg.plan_retention(None, 200, now_ms=500) == 2  # exactly retention_ms old stays (Kafka: older than)
        assert lg.plan_retention(None, 10**9, now_ms=500) == 0
        assert lg.plan_retention(None, 0, now_ms=10**9) == 4  # never the active segment
        assert lg.plan_retention(None, -1, now_ms=10**9) == 0  # Kafka's -1: unlimited
        assert lg.plan_retention(None, None, now_ms=10**9) == 0
        with pytest.raises(ValueError):
            lg.plan_retention(None, 100)
        assert lg.log_start_offset == 0  # planning deletes nothing
        assert lg.delete_records_before(lg.plan_retention(None, 250, 500)) == 2
        assert lg.segment_base_offsets == [2, 3, 4]


def test_retention_by_time_stops_at_the_first_segment_that_must_stay(d):
    with _one_batch_segments(d, [100, 900, 100, 100, 100]) as lg:
        assert lg.plan_retention(None, 500, now_ms=1000) == 1  # segment 1 is new: 2 and 3 wait behind it


def test_retention_by_time_after_a_restart(d):
    _one_batch_segments(d, [100, 200, 300, 400], index_min_bytes=1).close()  # from the index files
    with PartitionLog(d, segment_bytes=len(b(1)), index_min_bytes=1) as lg:
        assert lg.open_stats["indexed"] == 4
        assert lg.plan_retention(None, 150, now_ms=400) == 2
    for name in os.listdir(d):
        if name.endswith(".index"):
            os.unlink(os.path.join(d, name))
    with PartitionLog(d, segment_bytes=len(b(1))) as lg:  # read whole
        assert lg.open_stats["indexed"] == 0
        assert lg.plan_retention(None, 150, now_ms=400) == 2


def test_retention_by_time_of_a_segment_without_timestamps_uses_its_modification_time(d):
    with _one_batch_segments(d, [-1, -1, -1]) as lg:
        old = os.path.join(d, segment_name(0))
        os.utime(old, ns=(10**15, 10**15))  # 1,000,000,000 ms
        assert lg.plan_retention(None, 1000, now_ms=10**9 + 1001) == 1  # segment 1's mtime is now: it stays


def test_retention_by_time_and_size_together_delete_what_either_would(d):
    one = len(b(1))
    with _one_batch_segments(d, [100, 200, 300, 400, 500, 600]) as lg:
        assert lg.plan_retention(4 * one, 250, now_ms=400) == 2  # size: 2 segments go; time: 1
        assert lg.plan_retention(5 * one, 150, now_ms=400) == 2  # size: 1; time: 2
        assert lg.plan_retention(5 * one) == 1  # the one-argument call: size only


# ------------------------------------------------------------------ bounded file descriptors

def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_segment_files_are_bounded_while_reading_many_segments_of_many_logs(tmp_path):
    files = SegmentFiles(3)
    one = len(b(1))
    logs = [PartitionLog(str(tmp_path / f"t-{k}"), segment_bytes=one, files=files) for k in range(4)]
    for k, lg in enumerate(logs):
        lg.append([b(1, f"p{k}o{i}") for i in range(6)])
    baseline = _open_fds() - files.open_count
    for round_ in range(2):
        for i in range(6):
            for k, lg in enumerate(logs):
                assert values(lg.read(i, 10**6)) == [(i, f"p{k}o{i}0".encode().ljust(10, b"."))]
                assert files.open_count <= 3
                assert _open_fds() <= baseline + 3
    assert files.stats["evictions"] > 0
    for lg in logs:
        lg.close()
    assert files.open_count == 0 and _open_fds() == baseline


def test_appends_after_the_active_segment_was_evicted(tmp_path):
    files = SegmentFiles(1)
    a = PartitionLog(str(tmp_path / "a-0"), files=files)
    c = PartitionLog(str(tmp_path / "c-0"), files=files)
    for i in range(5):
        assert a.append([b(1, f"a{i}")]) == i
        assert c.append([b(1, f"c{i}")]) == i  # closes a's active segment; a's next append reopens it
    assert files.open_count == 1 and files.stats["opens"] >= 10
    assert [v[:2] for _, v in values(a.read(0, 10**6))] == [f"a{i}".encode() for i in range(5)]
    a.close()
    c.close()
    with PartitionLog(str(tmp_path / "a-0")) as a:
        assert [v[:2] for _, v in values(a.read(0, 10**6))] == [f"a{i}".encode() for i in range(5)]


def test_a_pinned_descriptor_is_not_closed_by_another_logs_eviction(tmp_path):
    files = SegmentFiles(1)
    a = PartitionLog(str(tmp_path / "a-0"), files=files)
    c = PartitionLog(str(tmp_path / "c-0"), files=files)
    a.append([b(1, "a")])
    c.append([b(1, "c")])
    path = os.path.join(a.directory, segment_name(0))
    with files.use(path) as fd:  # a reader of a, in the middle of its read
        for _ in range(3):
            assert values(c.read(0, 100)) == [(0, b"c0........")]  # c's segment needs a descriptor too
            assert files.open_count == 1  # c's was closed after its read, a's pinned one was not
        with files.use(os.path.join(c.directory, segment_name(0))):
            assert files.open_count == 2  # both pinned: over the bound rather than closing one in use
        assert values(os.pread(fd, 1000, 0)) == [(0, b"a0........")]
    assert files.open_count == 1
    a.close()
    c.close()


def test_forget_while_pinned_closes_when_the_user_is_done(tmp_path):
    path = str(tmp_path / "f")
    open(path, "wb").close()
    files = SegmentFiles(4)
    with files.use(path) as fd:
        files.forget(path)
        os.fstat(fd)  # still open
        assert files.open_count == 1
    assert files.open_count == 0
    with pytest.raises(OSError):
        os.fstat(fd)


def test_failed_append_is_undone_when_the_active_segment_was_evicted(tmp_path, monkeypatch):
    files = SegmentFiles(1)
    one = len(b(1))
    a = PartitionLog(str(tmp_path / "a-0"), segment_bytes=3 * one, files=files)
    c = PartitionLog(str(tmp_path / "c-0"), files=files)
    a.append([b(2, "keep")])
    c.append([b(1)])  # a's active descriptor is closed
    with second_write_fails(monkeypatch):  # a's first segment fills, the roll succeeds, the second write fails
        with pytest.raises(OSError):
            a.append([b(1, "lost") for _ in range(3)])
    assert a.log_end_offset == 2 and a.segment_base_offsets == [0]
    assert sorted(os.listdir(a.directory)) == [segment_name(0)]
    c.append([b(1)])
    assert a.append([b(1, "after")]) == 2
    assert files.open_count <= 1
    a.close()
    c.close()
    with PartitionLog(str(tmp_path / "a-0")) as a:
        assert [v[:5] for _, v in values(a.read(0, 10**6))] == [b"keep0", b"keep1", b"after"]


def test_deleting_segments_closes_their_descriptors(tmp_path):
    files = SegmentFiles(10)
    one = len(b(1))
    with PartitionLog(str(tmp_path / "t-0"), segment_bytes=one, files=files) as lg:
        lg.append([b(1) for _ in range(5)])
        for i in range(5):
            lg.read(i, 100)
        assert files.open_count == 5
        lg.delete_records_before(3)
        assert files.open_count == 2
    assert files.open_count == 0


def test_partitions_on_threads_share_a_small_cache(tmp_path):
    files = SegmentFiles(2)
    one = len(b(1))
    logs = [PartitionLog(str(tmp_path / f"t-{k}"), segment_bytes=2 * one, files=files) for k in range(4)]
    errors = []
    start = threading.Barrier(len(logs))

    def work(k: int, lg: PartitionLog) -> None:  # each log is used by one thread only, as a Partition's lock does
        try:
            start.wait()
            for i in range(40):
                assert lg.append([b(1, f"{k}.{i}")]) == i
                assert values(lg.read(i // 2, 10**6))[0][0] <= i // 2
                assert values(lg.read(i, 10**6))[-1] == (i, f"{k}.{i}0".encode().ljust(10, b"."))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k, lg)) for k, lg in enumerate(logs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert files.open_count <= 2
    for lg in logs:
        lg.close()
