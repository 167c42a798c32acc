"""Unit tests for broker.producer_state's snapshots (writing, reading, refusing damaged or invalid ones)
and recovery from a snapshot plus the log."""
from __future__ import annotations

import os

import pytest

from broker.log import PartitionLog
from broker.producer_state import Action, ProducerStateManager, list_snapshots, read_snapshot, snapshot_path
from broker.recordbatch import encode_batch
from snapshots.storage.disk import CorruptFileError
from records.wire.errors import Errors
from tests.broker.producer_batches import DAY, NOW, Sim, _append, _forge, hdr, raw


# ------------------------------------------------------------------ snapshots

def _state(n_producers: int = 3) -> Sim:
    s = Sim()
    for pid in range(n_producers):
        for seq in range(0, 14, 2):
            s.append(hdr(pid, pid, seq, n=2), now=NOW + pid)
    return s


def test_snapshot_round_trip(tmp_path):
    s = _state()
    path = str(tmp_path / "x.snapshot")
    size = s.m.write_snapshot(path, s.end)
    assert size == os.path.getsize(path)
    m2 = ProducerStateManager()
    assert m2.load_snapshot(path) == s.end
    assert m2.producers() == s.m.producers()
    assert m2.check(hdr(1, 1, 12, n=2)).action is Action.DUPLICATE
    assert m2.check(hdr(1, 1, 14)).action is Action.APPEND
    assert m2.check(hdr(1, 0, 14)).error == Errors.INVALID_PRODUCER_EPOCH


def test_take_snapshot_keeps_the_newest_two(tmp_path):
    s = _state(1)
    d = str(tmp_path)
    for off in (5, 9, 12):
        s.m.take_snapshot(d, off)
    assert [o for o, _ in list_snapshots(d)] == [9, 12]


@pytest.mark.parametrize("damage", ["flip", "truncate", "magic", "pad", "empty"])
def test_corrupt_snapshot_is_refused_naming_the_file(tmp_path, damage):
    s = _state()
    path = str(tmp_path / "x.snapshot")
    s.m.write_snapshot(path, s.end)
    data = bytearray(open(path, "rb").read())
    if damage == "flip":
        data[len(data) // 2] ^= 0x10
    elif damage == "truncate":
        data = data[:-3]
    elif damage == "magic":
        data[0:2] = b"XX"
    elif damage == "pad":
        data += b"\x00"
    else:
        data = bytearray()
    open(path, "wb").write(data)
    m2 = ProducerStateManager()
    with pytest.raises(CorruptFileError) as ei:
        m2.load_snapshot(path)
    assert ei.value.path == path
    assert len(m2) == 0


@pytest.mark.parametrize("obj", [
    {"format": 2, "offset": 5, "producers": []},
    {"format": 1, "offset": -1, "producers": []},
    {"format": 1, "offset": 5, "producers": {}},
    {"format": 1, "offset": 5, "producers": [[1, 0, 0, [[0, 0, 7, 7, 0]]]]},  # batch at/after the offset
    {"format": 1, "offset": 5, "producers": [[1, 40000, 0, []]]},  # epoch beyond int16
    {"format": 1, "offset": 5, "producers": [[1, 0, 0, []], [1, 0, 0, []]]},
    {"format": 1, "offset": 9, "producers": [[1, 0, 0, [[0, 0, 1, 1, 0]] * 6]]},
    {"format": 1, "offset": 5, "producers": [[1, True, 0, []]]},
    [1, 2, 3],
])
def test_well_checksummed_but_invalid_snapshot_is_refused(tmp_path, obj):
    path = str(tmp_path / "x.snapshot")
    _forge(path, obj)
    with pytest.raises(CorruptFileError):
        read_snapshot(path)


def test_missing_snapshot_file_is_an_error(tmp_path):
    with pytest.raises(CorruptFileError):
        read_snapshot(str(tmp_path / "nope.snapshot"))


# ------------------------------------------------------------------ recovery from snapshot + log


def test_recover_without_a_snapshot_replays_the_whole_log(tmp_path):
    d = str(tmp_path / "p")
    with PartitionLog(d) as lg:
        m = ProducerStateManager()
        for seq in range(8):
            _append(lg, m, raw(1, 0, seq))
        _append(lg, m, raw(2, 1, 0, n=4))
    with PartitionLog(d) as lg:
        r = ProducerStateManager.recover(d, lg, NOW)
    assert r.recovery_stats == {"snapshot_offset": -1, "replayed_batches": 9, "producers": 2}
    assert r.producers() == m.producers()


def test_recover_replays_only_what_follows_the_snapshot(tmp_path):
    d = str(tmp_path / "p")
    with PartitionLog(d) as lg:
        m = ProducerStateManager()
        for seq in range(500):
            _append(lg, m, raw(seq % 7, 0, seq // 7))
        m.take_snapshot(d, lg.log_end_offset)
        for seq in range(500, 503):
            _append(lg, m, raw(seq % 7, 0, seq // 7))
        expected = m.producers()
    with PartitionLog(d) as lg:
        r = ProducerStateManager.recover(d, lg, NOW)
    assert r.recovery_stats["snapshot_offset"] == 500
    assert r.recovery_stats["replayed_batches"] == 3
    assert r.producers() == expected


def test_state_survives_deleting_every_segment_it_came_from(tmp_path):
    d = str(tmp_path / "p")
    one = len(raw(1, 0, 0))
    with PartitionLog(d, segment_bytes=2 * one) as lg:
        m = ProducerStateManager()
        for seq in range(6):
            _append(lg, m, raw(1, 0, seq))
        _append(lg, m, encode_batch([(None, b"other")]))  # rolls: offsets 0..5 are in full segments now
        path = m.take_snapshot(d, lg.log_end_offset)  # snapshot first, then delete
        lg.delete_records_before(lg.log_end_offset)
        assert lg.segment_base_offsets == [6]
    with PartitionLog(d, segment_bytes=2 * one) as lg:
        r = ProducerStateManager.recover(d, lg, NOW)
        assert r.recovery_stats["replayed_batches"] == 0
    for seq in range(1, 6):
        dup = r.check(hdr(1, 0, seq))
        assert (dup.action, dup.first_offset) == (Action.DUPLICATE, seq)
    assert r.check(hdr(1, 0, 7)).error == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER
    # without the snapshot the state would be gone with the segments
    os.unlink(path)
    with PartitionLog(d, segment_bytes=2 * one) as lg:
        assert ProducerStateManager.recover(d, lg, NOW).get(1) is None


def test_snapshot_beyond_the_log_end_is_refused(tmp_path):
    d = str(tmp_path / "p")
    with PartitionLog(d) as lg:
        m = ProducerStateManager()
        _append(lg, m, raw(1, 0, 0))
        m.take_snapshot(d, 5)
    with PartitionLog(d) as lg:
        with pytest.raises(CorruptFileError) as ei:
            ProducerStateManager.recover(d, lg, NOW)
    assert ei.value.path == snapshot_path(d, 5) and "missing" in str(ei.value)


def test_recover_refuses_a_corrupt_newest_snapshot(tmp_path):
    d = str(tmp_path / "p")
    with PartitionLog(d) as lg:
        m = ProducerStateManager()
        _append(lg, m, raw(1, 0, 0))
        path = m.take_snapshot(d, lg.log_end_offset)
    with open(path, "r+b") as f:
        f.seek(20)
        f.write(b"\xff\xff")
    with PartitionLog(d) as lg:
        with pytest.raises(CorruptFileError) as ei:
            ProducerStateManager.recover(d, lg, NOW)
    assert ei.value.path == path


def test_replayed_producers_expire_from_recovery_time_not_earlier(tmp_path):
    d = str(tmp_path / "p")
    with PartitionLog(d) as lg:
        m = ProducerStateManager()
        _append(lg, m, raw(1, 0, 0), now=NOW)
    with PartitionLog(d) as lg:
        r = ProducerStateManager.recover(d, lg, NOW + 2 * DAY)
    assert r.expire(NOW + 2 * DAY + 1, DAY) == 0
    assert r.expire(NOW + 3 * DAY, DAY) == 1 and r.get(1) is None
