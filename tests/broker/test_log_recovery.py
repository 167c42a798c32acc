"""broker.log.PartitionLog reopening its files: torn tails are cut, damage with data after it is refused,
and the index files that spare reading a segment (and when they are not trusted).  Real files in tmp_path."""
from __future__ import annotations

import logging
import os

import pytest

from broker import log as logmod
from broker.log import LOG_START_FILE, PartitionLog, index_name, segment_name
from snapshots.storage.disk import CorruptFileError
from tests.broker.log_batches import TS, b, two_to_a_segment, values


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
