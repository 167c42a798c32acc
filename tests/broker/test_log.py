"""Unit tests for broker.log.PartitionLog on real files in tmp_path: offsets, reads, restart, damage, deletion."""
from __future__ import annotations

import logging
import os

import pytest

from broker import log as logmod
from broker.log import LOG_START_FILE, OffsetOutOfRangeError, PartitionLog, segment_name
from broker.recordbatch import decode_all, encode_batch, parse_header
from storage.disk import CorruptFileError
from wire.errors import Errors

TS = 1_700_000_000_000


def b(n: int = 1, tag: str = "x", ts: int = TS, size: int = 10) -> bytes:
    return encode_batch([(None, f"{tag}{i}".encode().ljust(size, b".")) for i in range(n)], timestamp_ms=ts)


def values(blob: bytes) -> list[tuple[int, bytes]]:
    return [(off, val) for off, _, _, val in decode_all(blob)]


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


def test_failed_write_leaves_nothing_behind(d, monkeypatch):
    one = len(b(1))
    lg = PartitionLog(d, segment_bytes=3 * one)
    lg.append([b(2, "keep")])
    real = os.pwrite
    writes = []

    def flaky(fd, data, pos):
        writes.append(pos)
        if len(writes) == 2:  # the first segment fills, the roll succeeds, the second write fails
            raise OSError(28, "No space left on device")
        return real(fd, data, pos)

    monkeypatch.setattr(logmod.os, "pwrite", flaky)
    with pytest.raises(OSError):
        lg.append([b(1, "lost") for _ in range(3)])
    monkeypatch.setattr(logmod.os, "pwrite", real)
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
    one = len(b(1))
    with PartitionLog(d, segment_bytes=2 * one) as lg:
        lg.append([b(1) for _ in range(5)])
    older = os.path.join(d, segment_name(2))
    with open(older, "r+b") as f:
        f.truncate(2 * one - 5)
    with pytest.raises(CorruptFileError) as ei:
        PartitionLog(d)
    assert ei.value.path == older and "offset 3" in str(ei.value) and "not the last segment" in str(ei.value)


def test_missing_middle_segment_is_refused(d):
    one = len(b(1))
    with PartitionLog(d, segment_bytes=2 * one) as lg:
        lg.append([b(1) for _ in range(6)])
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
    one = len(b(1))
    with PartitionLog(d, segment_bytes=2 * one) as lg:
        lg.append([b(1) for _ in range(4)])
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
