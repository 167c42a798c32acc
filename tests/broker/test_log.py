"""Unit tests for broker.log.PartitionLog on real files in tmp_path: offsets, reads, restart, damage, deletion."""
from __future__ import annotations

import contextlib
import logging
import os
import threading

import pytest

from broker import log as logmod
from broker.log import LOG_START_FILE, OffsetOutOfRangeError, PartitionLog, SegmentFiles, index_name, segment_name
from broker.recordbatch import decode_all, encode_batch, parse_header
from snapshots.storage.disk import CorruptFileError
from records.wire.errors import Errors

TS = 1_700_000_000_000


def b(n: int = 1, tag: str = "x", ts: int = TS, size: int = 10) -> bytes:
    return encode_batch([(None, f"{tag}{i}".encode().ljust(size, b".")) for i in range(n)], timestamp_ms=ts)


def values(blob: bytes) -> list[tuple[int, bytes]]:
    return [(off, val) for off, _, _, val in decode_all(blob)]


def two_to_a_segment(d: str, batches: int) -> int:
    """Write a log in ``d`` of ``batches`` one-record batches, two to a segment (segments 0, 2, 4, ...);
    the size of one batch."""
    one = len(b(1))
    with PartitionLog(d, segment_bytes=2 * one) as lg:
        lg.append([b(1) for _ in range(batches)])
    return one


@pytest.fixture
def d(tmp_path) -> str:
    return str(tmp_path / "t-0")


def test_fresh_log_is_empty(d):
    with PartitionLog(d) as lg:
        assert (lg.log_start_offset, lg.log_end_offset) == (0, 0)
        assert lg.read(0, 1000) == b""
        assert os.listdir(d) == [segment_name(0)]


def test_append_assigns_consecutive_offsets_and_reads_back(d):
    with PartitionLog(d) as lg:
        assert lg.append([b(3, "a")]) == 0
        assert lg.append([b(1, "b"), b(2, "c")]) == 3
        assert lg.log_end_offset == 6
        got = values(lg.read(0, 1 << 20))
        assert got == [(0, b"a0........"), (1, b"a1........"), (2, b"a2........"), (3, b"b0........"),
                       (4, b"c0........"), (5, b"c1........")]
        # base offsets were rewritten, whatever the client sent
    with PartitionLog(d) as lg:
        assert [parse_header(lg.read(o, 1)).base_offset for o in range(6)] == [0, 0, 0, 3, 4, 4]


def test_client_base_offset_is_ignored(d):
    with PartitionLog(d) as lg:
        lg.append([encode_batch([(None, b"v")], base_offset=999)])
        assert parse_header(lg.read(0, 100)).base_offset == 0


def test_read_starts_at_the_batch_containing_the_offset(d):
    with PartitionLog(d) as lg:
        lg.append([b(3, "a"), b(3, "b")])
        assert [o for o, _ in values(lg.read(4, 1))] == [3, 4, 5]


def test_read_returns_at_least_one_batch_and_only_whole_batches(d):
    with PartitionLog(d) as lg:
        batches = [b(1, str(i), size=100) for i in range(5)]
        lg.append(batches)
        size = len(batches[0])
        assert len(lg.read(0, 0)) == size
        assert len(lg.read(0, size - 1)) == size
        assert len(lg.read(0, size)) == size
        assert len(lg.read(0, 2 * size + 5)) == 2 * size
        assert len(lg.read(3, 10**9)) == 2 * size
        assert [o for o, _ in values(lg.read(2, 2 * size))] == [2, 3]


def test_read_out_of_range(d):
    with PartitionLog(d) as lg:
        lg.append([b(2)])
        assert lg.read(2, 100) == b""
        for bad in (3, -1, 10**12):
            with pytest.raises(OffsetOutOfRangeError) as ei:
                lg.read(bad, 100)
            assert ei.value.code == Errors.OFFSET_OUT_OF_RANGE


def test_restart_keeps_everything_and_continues(d):
    with PartitionLog(d, segment_bytes=300) as lg:
        for i in range(10):
            lg.append([b(2, f"r{i}")])
        before = [lg.read(o, 10**6) for o in range(0, 20, 2)]
        segs = lg.segment_base_offsets
    assert len(segs) > 2
    with PartitionLog(d, segment_bytes=300) as lg:
        assert lg.log_end_offset == 20 and lg.segment_base_offsets == segs
        assert [lg.read(o, 10**6) for o in range(0, 20, 2)] == before
        assert lg.append([b(1, "next")]) == 20
        assert values(lg.read(20, 100)) == [(20, b"next0.....")]


def test_segments_roll_and_are_named_by_base_offset(d):
    one = len(b(1))
    with PartitionLog(d, segment_bytes=2 * one) as lg:
        lg.append([b(1) for _ in range(5)])
        assert lg.segment_base_offsets == [0, 2, 4]
        assert sorted(os.listdir(d)) == [segment_name(0), segment_name(2), segment_name(4)]
        assert os.path.getsize(os.path.join(d, segment_name(0))) == 2 * one
        # a read stays inside one segment
        assert [o for o, _ in values(lg.read(1, 10**6))] == [1]
        assert [o for o, _ in values(lg.read(2, 10**6))] == [2, 3]
    # a batch larger than a segment gets a segment of its own
    with PartitionLog(d, segment_bytes=10) as lg:
        lg.append([b(1)])
        assert lg.segment_base_offsets == [0, 2, 4, 5]


def test_group_commit_one_fsync_per_append(d, monkeypatch):
    lg = PartitionLog(d)
    calls = []
    real = os.fsync
    monkeypatch.setattr(logmod.os, "fsync", lambda fd: (calls.append(fd), real(fd)))
    lg.append([b(1) for _ in range(50)])
    assert len(calls) == 1
    lg.close()


@contextlib.contextmanager
def second_write_fails(monkeypatch):
    """The log's second pwrite in the block fails with ENOSPC."""
    real = os.pwrite
    writes = []

    def flaky(fd, data, pos):
        writes.append(pos)
        if len(writes) == 2:
            raise OSError(28, "No space left on device")
        return real(fd, data, pos)

    monkeypatch.setattr(logmod.os, "pwrite", flaky)
    try:
        yield
    finally:
        monkeypatch.setattr(logmod.os, "pwrite", real)


def test_failed_write_leaves_nothing_behind(d, monkeypatch):
    one = len(b(1))
    lg = PartitionLog(d, segment_bytes=3 * one)
    lg.append([b(2, "keep")])
    with second_write_fails(monkeypatch):  # the first segment fills, the roll succeeds, the second write fails
        with pytest.raises(OSError):
            lg.append([b(1, "lost") for _ in range(3)])
    assert lg.log_end_offset == 2 and lg.segment_base_offsets == [0]
    assert os.path.getsize(os.path.join(d, segment_name(0))) == len(b(2, "keep"))
    assert lg.append([b(1, "after")]) == 2
    lg.close()
    with PartitionLog(d, segment_bytes=3 * one) as lg:
        assert [v[:5] for _, v in values(lg.read(0, 10**6))] == [b"keep0", b"keep1", b"after"]


def test_append_refuses_non_batches(d):
    with PartitionLog(d) as lg:
        with pytest.raises(ValueError):
            lg.append([])
        with pytest.raises(ValueError):
            lg.append([b(1)[:-1]])
        assert lg.log_end_offset == 0


# ------------------------------------------------------------------ recovery

def _last_segment(d: str) -> str:
    return os.path.join(d, sorted(f for f in os.listdir(d) if f.endswith(".log"))[-1])


@pytest.mark.parametrize("keep", [1, 12, 60, 61, 70])
def test_torn_tail_is_cut_with_a_warning(d, caplog, keep):
    with PartitionLog(d) as lg:
        lg.append([b(2, "a"), b(1, "b")])
    torn = b(4, "torn")[:keep]  # an append cut by a crash
    path = _last_segment(d)
    good = os.path.getsize(path)
    with open(path, "ab") as f:
        f.write(torn)
    with caplog.at_level(logging.WARNING, logger="broker.log"):
        lg = PartitionLog(d)
    assert "torn tail" in caplog.text and "offset 3" in caplog.text
    assert lg.log_end_offset == 3 and os.path.getsize(path) == good
    assert lg.append([b(1, "c")]) == 3
    lg.close()
    with PartitionLog(d) as lg:
        assert [o for o, _ in values(lg.read(0, 10**6))] == [0, 1, 2, 3]


def test_whole_last_batch_with_bad_crc_is_a_torn_tail(d, caplog):
    with PartitionLog(d) as lg:
        lg.append([b(2, "a")])
        lg.append([b(1, "b")])
    path = _last_segment(d)
    data = bytearray(open(path, "rb").read())
    data[-1] ^= 0xFF  # the last block never reached the disk
    open(path, "wb").write(data)
    with PartitionLog(d) as lg:
        assert lg.log_end_offset == 2
    assert "CRC" in caplog.text


def test_corrupt_batch_with_valid_data_after_is_refused(d):
    with PartitionLog(d) as lg:
        lg.append([b(2, "a"), b(1, "b"), b(1, "c")])
    path = _last_segment(d)
    data = bytearray(open(path, "rb").read())
    data[len(b(2, "a")) + 70] ^= 0x01  # inside the batch at offset 2
    open(path, "wb").write(data)
    size = len(data)
    with pytest.raises(CorruptFileError) as ei:
        PartitionLog(d)
    assert ei.value.path == path
    assert "offset 2" in str(ei.value) and "valid batches follow" in str(ei.value)
    assert os.path.getsize(path) == size  # nothing was cut


def test_zeroed_hole_with_valid_data_after_is_refused(d):
    with PartitionLog(d) as lg:
        lg.append([b(1, "a"), b(1, "b"), b(1, "c")])
    path = _last_segment(d)
    data = bytearray(open(path, "rb").read())
    one = len(b(1, "a"))
    data[one:2 * one] = bytes(one)
    open(path, "wb").write(data)
    with pytest.raises(CorruptFileError, match="offset 1"):
        PartitionLog(d)


def test_damage_in_an_older_segment_is_refused_even_at_its_end(d):
    one = two_to_a_segment(d, 5)
    older = os.path.join(d, segment_name(2))
    with open(older, "r+b") as f:
        f.truncate(2 * one - 5)
    with pytest.raises(CorruptFileError) as ei:
        PartitionLog(d)
    assert ei.value.path == older and "offset 3" in str(ei.value) and "not the last segment" in str(ei.value)


def test_missing_middle_segment_is_refused(d):
    two_to_a_segment(d, 6)
    os.unlink(os.path.join(d, segment_name(2)))
    with pytest.raises(CorruptFileError) as ei:
        PartitionLog(d)
    assert ei.value.path == os.path.join(d, segment_name(4))
    assert "missing" in str(ei.value) and "ends at offset 2" in str(ei.value)


def test_missing_first_segment_is_refused_once_a_start_offset_was_stored(d):
    one = len(b(1))
    with PartitionLog(d, segment_bytes=2 * one) as lg:
        lg.append([b(1) for _ in range(6)])
        lg.delete_records_before(1)
    os.unlink(os.path.join(d, segment_name(0)))
    with pytest.raises(CorruptFileError, match="segments are missing"):
        PartitionLog(d)


def test_segment_whose_first_batch_has_the_wrong_offset_is_refused(d):
    two_to_a_segment(d, 4)
    os.rename(os.path.join(d, segment_name(0)), os.path.join(d, segment_name(1)))
    with pytest.raises(CorruptFileError):
        PartitionLog(d)


def test_corrupt_log_start_file_is_refused(d):
    with PartitionLog(d) as lg:
        lg.append([b(3)])
        lg.delete_records_before(1)
    path = os.path.join(d, LOG_START_FILE)
    data = bytearray(open(path, "rb").read())
    data[-6] ^= 1
    open(path, "wb").write(data)
    with pytest.raises(CorruptFileError) as ei:
        PartitionLog(d)
    assert ei.value.path == path and "checksum" in str(ei.value)


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


# ------------------------------------------------------------------ timestamps and headers

def test_offset_for_timestamp(d):
    with PartitionLog(d) as lg:
        assert lg.offset_for_timestamp(TS) is None
        lg.append([encode_batch([(None, b"a"), (None, b"b"), (None, b"c")], timestamps=[100, 300, 200])])
        lg.append([encode_batch([(None, b"d")], timestamp_ms=150)])
        lg.append([encode_batch([(None, b"e"), (None, b"f")], timestamps=[400, 500])])
        assert lg.offset_for_timestamp(-1) == (6, -1)
        assert lg.offset_for_timestamp(-2) == (0, -1)
        assert lg.offset_for_timestamp(0) == (0, 100)
        assert lg.offset_for_timestamp(101) == (1, 300)
        assert lg.offset_for_timestamp(300) == (1, 300)
        assert lg.offset_for_timestamp(301) == (4, 400)
        assert lg.offset_for_timestamp(500) == (5, 500)
        assert lg.offset_for_timestamp(501) is None
        with pytest.raises(ValueError):
            lg.offset_for_timestamp(-3)
        lg.delete_records_before(2)
        assert lg.offset_for_timestamp(0) == (2, 200)
        assert lg.offset_for_timestamp(-2) == (2, -1)


def test_offset_for_timestamp_survives_restart_across_segments(d):
    one = len(b(1))
    with PartitionLog(d, segment_bytes=one) as lg:
        lg.append([b(1, ts=t) for t in (10, 30, 20, 40)])
    with PartitionLog(d, segment_bytes=one) as lg:
        assert lg.offset_for_timestamp(25) == (1, 30)
        assert lg.offset_for_timestamp(35) == (3, 40)


def test_iter_headers_from_an_offset(d):
    one = len(b(1))
    with PartitionLog(d, segment_bytes=3 * one) as lg:
        lg.append([b(2), b(1), b(3), b(1)])
        assert [h.base_offset for h in lg.iter_headers(0)] == [0, 2, 3, 6]
        assert [h.base_offset for h in lg.iter_headers(4)] == [3, 6]
        assert list(lg.iter_headers(7)) == []
        lg.delete_records_before(3)
        assert [h.base_offset for h in lg.iter_headers(0)] == [3, 6]


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


# ------------------------------------------------------------------ index files

def _build(d: str, n: int = 30, **kw) -> list[bytes]:
    """A closed log of ``n`` one-record batches in several segments, with index files; what reads return."""
    with PartitionLog(d, segment_bytes=6 * len(b(1)), index_min_bytes=1, **kw) as lg:
        for i in range(n):
            lg.append([b(1, f"i{i}", ts=TS + (i * 7919) % 100)])
        assert len(lg.segment_base_offsets) > 3
        return [lg.read(o, 10**6) for o in range(n)]


def _reopen(d: str, **kw) -> PartitionLog:
    return PartitionLog(d, segment_bytes=6 * len(b(1)), index_min_bytes=1, **kw)


def _index_files(d: str) -> list[str]:
    return sorted(f for f in os.listdir(d) if f.endswith(".index"))


def test_restart_loads_every_segment_from_its_index_without_reading_it(d, monkeypatch):
    before = _build(d)
    assert _index_files(d) == [index_name(base) for base in (0, 6, 12, 18, 24)]
    checked = []
    real = logmod.check_framing
    monkeypatch.setattr(logmod, "check_framing", lambda data, pos=0: (checked.append(pos), real(data, pos))[1])
    with _reopen(d) as lg:
        stats = dict(lg.open_stats)
        assert stats.pop("open_ms") > 0
        assert stats == {"segments": 5, "indexed": 5, "indexed_bytes": lg.size_bytes, "scanned_bytes": 0,
                         "index_fallbacks": 0}
        assert len(checked) == 5  # the last indexed batch of each segment, nothing else
        assert [lg.read(o, 10**6) for o in range(30)] == before
        assert lg.offset_for_timestamp(TS + 50) == (next(i for i in range(30) if (i * 7919) % 100 >= 50),
                                                    TS + next((i * 7919) % 100 for i in range(30)
                                                              if (i * 7919) % 100 >= 50))
        assert lg.append([b(1, "more")]) == 30
    with _reopen(d) as lg:
        assert lg.open_stats["scanned_bytes"] == 0
        assert values(lg.read(30, 100)) == [(30, b"more0.....")]


def test_offset_for_timestamp_is_the_same_with_and_without_the_index(d):
    _build(d)
    with _reopen(d) as lg:
        indexed = [lg.offset_for_timestamp(TS + t) for t in range(0, 101, 3)]
    for name in _index_files(d):
        os.unlink(os.path.join(d, name))
    with PartitionLog(d) as lg:
        assert lg.open_stats["indexed"] == 0
        assert [lg.offset_for_timestamp(TS + t) for t in range(0, 101, 3)] == indexed


def test_a_damaged_index_falls_back_to_reading_the_segment(d, caplog):
    before = _build(d)
    path = os.path.join(d, index_name(6))
    data = bytearray(open(path, "rb").read())
    data[60] ^= 0xFF
    open(path, "wb").write(data)
    with caplog.at_level(logging.INFO, logger="broker.log"), _reopen(d) as lg:
        assert lg.open_stats["index_fallbacks"] == 1 and lg.open_stats["indexed"] == 4
        assert lg.open_stats["scanned_bytes"] == os.path.getsize(os.path.join(d, segment_name(6)))
        assert [lg.read(o, 10**6) for o in range(30)] == before
    assert "checksum mismatch" in caplog.text and index_name(6) in caplog.text
    with _reopen(d) as lg:  # written again after the read
        assert lg.open_stats["indexed"] == 5


def test_an_index_for_another_segment_falls_back(d, caplog):
    before = _build(d)
    os.replace(os.path.join(d, index_name(0)), os.path.join(d, index_name(12)))
    with _reopen(d) as lg:
        assert lg.open_stats["index_fallbacks"] == 1 and lg.open_stats["indexed"] == 3
        assert [lg.read(o, 10**6) for o in range(30)] == before
    assert "is for base offset 0, not 12" in caplog.text


def test_an_index_covering_more_than_the_segment_falls_back(d, caplog):
    _build(d)
    active = os.path.join(d, segment_name(24))
    with open(active, "r+b") as f:  # the active segment lost its last batch behind the index's back
        f.truncate(os.path.getsize(active) - len(b(1)))
    with _reopen(d) as lg:
        assert lg.open_stats["index_fallbacks"] == 1
        assert lg.log_end_offset == 29
    assert "stale" in caplog.text


def test_damage_in_the_last_indexed_batch_is_not_hidden_by_the_index(d, caplog):
    _build(d)
    path = os.path.join(d, segment_name(18))
    data = bytearray(open(path, "rb").read())
    data[-1] ^= 0x01  # the last batch of a sealed segment: its index is refused, the full read refuses the damage
    open(path, "wb").write(data)
    with pytest.raises(CorruptFileError) as ei:
        _reopen(d)
    assert ei.value.path == path and "offset 23" in str(ei.value)
    assert "stale" in caplog.text


def test_a_missing_index_after_a_crash_between_segment_and_index(d):
    before = _build(d)
    os.unlink(os.path.join(d, index_name(6)))  # the crash came after the roll, before the index was written
    with _reopen(d) as lg:
        assert lg.open_stats["indexed"] == 4 and lg.open_stats["index_fallbacks"] == 0
        assert [lg.read(o, 10**6) for o in range(30)] == before
    assert index_name(6) in _index_files(d)


def test_a_torn_tail_after_the_indexed_prefix_is_cut(d, caplog):
    before = _build(d)
    path = _last_segment(d)
    good = os.path.getsize(path)
    torn = b(4, "torn")[:50]
    with open(path, "ab") as f:
        f.write(torn)
    with caplog.at_level(logging.WARNING, logger="broker.log"), _reopen(d) as lg:
        assert lg.open_stats["indexed"] == 5 and lg.open_stats["scanned_bytes"] == len(torn)
        assert "torn tail" in caplog.text and "offset 30" in caplog.text
        assert os.path.getsize(path) == good and lg.log_end_offset == 30
        assert [lg.read(o, 10**6) for o in range(30)] == before
        assert lg.append([b(1, "after")]) == 30


def test_batches_after_the_indexed_prefix_are_checked(d):
    _build(d, 27)
    with _reopen(d) as lg:
        lg.append([b(1, "x"), b(1, "y"), b(1, "z")])
        assert lg.segment_base_offsets[-1] == 24
        idx = os.path.join(d, index_name(24))
        stale = open(idx, "rb").read()  # the active segment's index from the previous close
    open(idx, "wb").write(stale)  # as after a crash: the index covers a prefix of the segment
    with _reopen(d) as lg:
        assert lg.open_stats["indexed"] == 5 and lg.open_stats["scanned_bytes"] == 3 * len(b(1, "x"))
        assert lg.log_end_offset == 30
        assert values(lg.read(28, 1))[0] == (28, b"y0........")
    open(idx, "wb").write(stale)
    path = _last_segment(d)
    data = bytearray(open(path, "rb").read())
    data[-2 * len(b(1)) - 5] ^= 0x01  # inside the batch at offset 31, with a valid one after it
    open(path, "wb").write(data)
    with pytest.raises(CorruptFileError, match="valid batches follow"):
        _reopen(d)


def test_deletion_removes_the_index_with_its_segment(d):
    _build(d)
    with _reopen(d) as lg:
        lg.delete_records_before(13)
        assert lg.segment_base_offsets == [12, 18, 24]
    assert _index_files(d) == [index_name(12), index_name(18), index_name(24)]


def test_leftover_index_files_are_removed_on_open(d):
    _build(d)
    os.unlink(os.path.join(d, segment_name(0)))  # a deletion cut by a crash after the segment went
    logmod.PartitionLog._store_log_start(_reopen_no_open(d), 6)
    open(os.path.join(d, index_name(6) + ".tmp"), "wb").write(b"half")
    with _reopen(d) as lg:
        assert lg.log_start_offset == 6 and lg.open_stats["indexed"] == 4
    assert _index_files(d) == [index_name(b) for b in (6, 12, 18, 24)]
    assert not [f for f in os.listdir(d) if f.endswith(".tmp")]


def _reopen_no_open(d: str) -> PartitionLog:
    """A PartitionLog object on ``d`` for its file helpers, without opening the segments."""
    lg = PartitionLog.__new__(PartitionLog)
    lg.directory, lg.fsync = d, True
    return lg


def test_small_segments_get_no_index(d):
    with PartitionLog(d) as lg:
        lg.append([b(3)])
    assert _index_files(d) == []
    with PartitionLog(d) as lg:
        assert lg.open_stats["indexed"] == 0 and lg.log_end_offset == 3
