"""Unit tests for broker.log.PartitionLog on real files in tmp_path: offsets, appends, reads, restart,
timestamps and headers.  Damage and index files are in test_log_recovery, deletion, retention and
bounded file descriptors in test_log_retention."""
from __future__ import annotations

import os

import pytest

from broker import log as logmod
from broker.log import OffsetOutOfRangeError, PartitionLog, segment_name
from broker.recordbatch import encode_batch, parse_header
from records.wire.errors import Errors
from tests.broker.log_batches import TS, b, second_write_fails, values


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
