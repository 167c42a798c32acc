"""Unit tests for quorum.trail: the audit trail files (no Raft, no network)."""
from __future__ import annotations

import os
import struct
import zlib

import msgpack
import pytest

from quorum.managers import ApplyOutcome, QuorumState
from quorum.trail import AuditLine, AuditWriter, checkpoint_path, iter_blocks, read_audit
from records import (
    AllocateProducerIdsRecord,
    AuditEntry,
    AuditGap,
    FenceBrokerRecord,
    RegisterBrokerRecord,
)
from records.codec import to_obj
from snapshots.storage.disk import CorruptFileError
from tests.quorum.file_damage import flip

TS = 1_700_000_000_000


def alloc(start: int, length: int = 100, broker_id: int = 1, epoch: int = 1) -> AllocateProducerIdsRecord:
    return AllocateProducerIdsRecord(broker_id=broker_id, broker_epoch=epoch, producer_id_start=start,
                                     producer_id_len=length, timestamp_ms=TS)


def reg(broker_id: int = 1, epoch: int = 1) -> RegisterBrokerRecord:
    return RegisterBrokerRecord(broker_id=broker_id, incarnation_id=f"inc-{broker_id}", broker_epoch=epoch,
                                listener="h:1", timestamp_ms=TS)


def ok(rec) -> ApplyOutcome:
    return ApplyOutcome(rec)


def refused(rec, why: str = "refused") -> ApplyOutcome:
    return ApplyOutcome(rec, why)


def block_dict(raft_index: int, raft_term: int, rec: AllocateProducerIdsRecord) -> dict:
    return {"raft_index": raft_index, "raft_term": raft_term, **rec.to_dict()}


def frame_offsets(path: str) -> list[int]:
    with open(path, "rb") as f:
        data = f.read()
    out, pos = [], 0
    while pos < len(data):
        out.append(pos)
        (length, _) = struct.unpack_from("<II", data, pos)
        pos += 8 + length
    assert pos == len(data)
    return out


def write_trail(path: str, entries, checkpoint: bool = False) -> None:
    """entries: (raft_index, raft_term, [outcome, ...]) or ("gap", raft_index).

    Without ``checkpoint`` the lines are on disk but not checkpointed, as
    after a crash between two syncs: the next writer scans all of them.
    """
    w = AuditWriter(path)
    for e in entries:
        if e[0] == "gap":
            w.gap(e[1])
        else:
            w.append(*e)
    w.close()
    if not checkpoint:
        os.remove(checkpoint_path(path))


def indexes(path: str) -> list[tuple[int, int | None]]:
    lines, _ = read_audit(path)
    return [(ln.entry.raft_index, getattr(ln.entry, "position", None)) for ln in lines]


@pytest.fixture
def path(tmp_path) -> str:
    return str(tmp_path / "audit.log")


# --------------------------------------------------------------------------
# appending
# --------------------------------------------------------------------------


def test_new_writer_creates_empty_file(path):
    w = AuditWriter(path)
    assert w.last_index == 0
    w.close()
    assert os.path.getsize(path) == 0
    assert read_audit(path) == ([], 0)


def test_append_writes_one_line_per_record(path):
    w = AuditWriter(path)
    w.append(5, 2, [ok(reg()), ok(alloc(0)), refused(alloc(0), "block [0, 100) starts below")])
    w.close()
    lines, valid = read_audit(path)
    assert valid == os.path.getsize(path)
    assert [ln.entry for ln in lines] == [
        AuditEntry(raft_index=5, raft_term=2, position=0, accepted=True, error=None, record="RegisterBrokerRecord"),
        AuditEntry(raft_index=5, raft_term=2, position=1, accepted=True, error=None,
                   record="AllocateProducerIdsRecord"),
        AuditEntry(raft_index=5, raft_term=2, position=2, accepted=False, error="block [0, 100) starts below",
                   record="AllocateProducerIdsRecord"),
    ]
    assert [ln.record for ln in lines] == [reg(), alloc(0), alloc(0)]


def test_append_outcomes_from_apply_batch(path):
    state = QuorumState()
    outcomes = state.apply_batch([reg(), alloc(0), alloc(50), FenceBrokerRecord(broker_id=9, broker_epoch=1)])
    w = AuditWriter(path)
    w.append(1, 1, outcomes)
    w.close()
    lines, _ = read_audit(path)
    assert [ln.entry.accepted for ln in lines] == [True, True, False, False]
    assert "starts below" in lines[2].entry.error
    assert "not registered" in lines[3].entry.error


def test_line_frame_format(path):
    write_trail(path, [(3, 1, [ok(alloc(0))])])
    with open(path, "rb") as f:
        data = f.read()
    length, crc = struct.unpack_from("<II", data)
    body = data[8:]
    assert len(body) == length and zlib.crc32(body) == crc
    assert msgpack.unpackb(body) == [to_obj(AuditEntry(raft_index=3, raft_term=1, position=0, accepted=True,
                                                       record="AllocateProducerIdsRecord")),
                                     to_obj(alloc(0))]


def test_append_is_idempotent_by_raft_index(path):
    w = AuditWriter(path)
    w.append(1, 1, [ok(reg())])
    w.append(2, 1, [ok(alloc(0))])
    size = os.path.getsize(path)
    w.append(2, 1, [ok(alloc(0))])   # replayed again: skipped
    w.append(1, 1, [ok(reg())])      # older: skipped
    assert os.path.getsize(path) == size
    assert w.last_index == 2
    w.close()
    assert indexes(path) == [(1, 0), (2, 0)]


def test_append_is_idempotent_across_reopen(path):
    write_trail(path, [(1, 1, [ok(reg())]), (2, 1, [ok(alloc(0)), ok(alloc(100))])])
    size = os.path.getsize(path)
    # The node restarts and replays its journal from the start.
    w = AuditWriter(path)
    assert w.last_index == 2
    w.append(1, 1, [ok(reg())])
    w.append(2, 1, [ok(alloc(0)), ok(alloc(100))])
    assert os.path.getsize(path) == size
    w.append(3, 2, [ok(alloc(200))])
    w.close()
    assert indexes(path) == [(1, 0), (2, 0), (2, 1), (3, 0)]
    w2 = AuditWriter(path)
    assert w2.last_index == 3
    w2.close()


def test_append_with_no_outcomes_writes_nothing(path):
    w = AuditWriter(path)
    w.append(1, 1, [])
    assert w.last_index == 1
    w.close()
    assert os.path.getsize(path) == 0


# --------------------------------------------------------------------------
# gaps
# --------------------------------------------------------------------------


def test_gap_writes_a_gap_line(path):
    w = AuditWriter(path)
    w.append(1, 1, [ok(reg())])
    w.gap(10)
    assert w.last_index == 10
    w.append(7, 1, [ok(alloc(0))])   # covered by the snapshot: skipped
    w.gap(9)                          # older gap: skipped
    w.gap(10)                         # same gap again: skipped
    w.append(11, 3, [ok(alloc(0))])
    w.close()
    lines, _ = read_audit(path)
    assert len(lines) == 3
    gap = lines[1]
    assert gap.entry == AuditGap(raft_index=10)
    assert gap.record is None
    assert gap.to_json_dict() == {"raft_index": 10, "gap": True}
    assert lines[2].entry.raft_index == 11


def test_gap_sets_last_index_across_reopen(path):
    write_trail(path, [("gap", 40)])
    w = AuditWriter(path)
    assert w.last_index == 40
    w.append(40, 1, [ok(alloc(0))])
    w.close()
    assert [type(ln.entry) for ln in read_audit(path)[0]] == [AuditGap]


def test_audit_line_to_json_dict(path):
    write_trail(path, [(4, 2, [refused(alloc(0), "nope")])])
    (line,), _ = read_audit(path)
    assert isinstance(line, AuditLine)
    assert line.to_json_dict() == {
        "raft_index": 4, "raft_term": 2, "position": 0, "accepted": False, "error": "nope",
        "record": alloc(0).to_json_dict(),
    }


# --------------------------------------------------------------------------
# torn and corrupt files
# --------------------------------------------------------------------------


@pytest.mark.parametrize("torn", ["half_header", "half_body", "bad_crc_last"])
def test_torn_last_line_is_cut_on_reopen(path, torn):
    write_trail(path, [(1, 1, [ok(reg())]), (2, 1, [ok(alloc(0))]), (3, 1, [ok(alloc(100))])])
    offsets = frame_offsets(path)
    size = os.path.getsize(path)
    if torn == "half_header":
        with open(path, "r+b") as f:
            f.truncate(offsets[-1] + 5)
    elif torn == "half_body":
        with open(path, "r+b") as f:
            f.truncate(offsets[-1] + (size - offsets[-1]) // 2 + 4)
    else:
        flip(path, size - 1, 0x01)
    damaged = os.path.getsize(path)

    # Reading without repair reports the valid length and leaves the file alone.
    lines, valid = read_audit(path)
    assert valid == offsets[-1]
    assert [ln.entry.raft_index for ln in lines] == [1, 2]
    assert os.path.getsize(path) == damaged

    # Opening a writer repairs: the torn line goes, index 3 can be written again.
    w = AuditWriter(path)
    assert os.path.getsize(path) == offsets[-1]
    assert w.last_index == 2
    w.append(3, 1, [ok(alloc(100))])
    w.close()
    lines, valid = read_audit(path)
    assert valid == os.path.getsize(path) == size
    assert [ln.entry.raft_index for ln in lines] == [1, 2, 3]


def test_garbage_after_last_line_is_cut_on_reopen(path):
    write_trail(path, [(1, 1, [ok(reg())])])
    size = os.path.getsize(path)
    with open(path, "ab") as f:
        f.write(b"\x05\x00")
    AuditWriter(path).close()
    assert os.path.getsize(path) == size


@pytest.mark.parametrize("where", ["crc", "body"])
def test_corrupt_middle_line_is_corruption_for_readers(path, where):
    write_trail(path, [(1, 1, [ok(reg())]), (2, 1, [ok(alloc(0))]), (3, 1, [ok(alloc(100))])])
    offsets = frame_offsets(path)
    flip(path, offsets[1] + (4 if where == "crc" else 8 + 3), 0x01)
    with open(path, "rb") as f:
        before = f.read()
    with pytest.raises(CorruptFileError) as ei:
        read_audit(path)
    assert ei.value.path == path and path in str(ei.value) and f"offset {offsets[1]}" in str(ei.value)
    with open(path, "rb") as f:
        assert f.read() == before  # nothing cut


@pytest.mark.parametrize("where", ["crc", "body"])
def test_damage_past_the_checkpoint_is_a_crash_tail_at_start(path, where):
    """Nothing after the checkpoint was synced, and a power loss may persist those pages in any order: a
    torn line with valid lines after it is a crash's tail there.  Start-up cuts it (found by the
    simulator: the node refused to start after a power loss); the journal replays what was cut."""
    write_trail(path, [(1, 1, [ok(reg())])], checkpoint=True)
    synced = os.path.getsize(path)
    w = AuditWriter(path)
    w.append(2, 1, [ok(alloc(0))])
    w.append(3, 1, [ok(alloc(100))])
    w._f.close()  # a crash: written, never synced, no new checkpoint
    offsets = frame_offsets(path)
    flip(path, offsets[1] + (4 if where == "crc" else 8 + 3), 0x01)
    with pytest.raises(CorruptFileError):
        read_audit(path)  # readers still say what they see
    w2 = AuditWriter(path)
    assert w2.last_index == 1 and os.path.getsize(path) == synced


def test_checksum_valid_but_undecodable_middle_line_is_corruption(path):
    write_trail(path, [(1, 1, [ok(reg())])])
    good = open(path, "rb").read()
    body = msgpack.packb([[999, 0, []], None])
    with open(path, "ab") as f:
        f.write(struct.pack("<II", len(body), zlib.crc32(body)) + body)
        f.write(good)  # a valid line after it
    with pytest.raises(CorruptFileError, match="bad audit line at offset") as ei:
        read_audit(path)
    assert path in str(ei.value)
    with pytest.raises(CorruptFileError):
        AuditWriter(path)


def test_damaged_length_without_a_checkpoint_is_cut_at_start_and_refused_by_readers(path):
    """Without a checkpoint nothing of the trail was synced, so the journal still holds every entry it
    covers (compaction syncs the trail first): start-up cuts at the damage and replay writes the lines
    again.  Readers, which cannot replay, refuse."""
    write_trail(path, [(1, 1, [ok(reg())]), (2, 1, [ok(alloc(0))]), (3, 1, [ok(alloc(100))])])
    offsets = frame_offsets(path)
    flip(path, offsets[1] + 3, 0x80)  # high byte of line 2's length
    with pytest.raises(CorruptFileError):
        read_audit(path)
    w = AuditWriter(path)
    assert w.last_index == 1 and os.path.getsize(path) == offsets[1]
    w.append(2, 1, [ok(alloc(0))])
    w.close()
    assert [i for i, _ in indexes(path)] == [1, 2]


# --------------------------------------------------------------------------
# iter_blocks
# --------------------------------------------------------------------------


def test_iter_blocks_merges_dedups_and_orders(tmp_path):
    a, b, c = (str(tmp_path / f"node{n}.audit") for n in "abc")
    b1, b2, b3, b4, b5, b6 = (alloc(i * 100, broker_id=1 + i % 2) for i in range(6))
    # Node a: indexes 1..4.
    write_trail(a, [
        (1, 1, [ok(reg(1, 1)), ok(reg(2, 2))]),
        (2, 1, [ok(b1)]),
        (3, 1, [refused(b1, "starts below"), ok(b2)]),
        (4, 2, [ok(FenceBrokerRecord(broker_id=2, broker_epoch=2))]),
    ])
    # Node c (listed before b): got a snapshot up to 3, then 5..6.
    write_trail(c, [
        ("gap", 3),
        (5, 2, [ok(b3), ok(b4)]),
        (6, 3, [ok(b5)]),
    ])
    # Node b: everything up to 7.
    write_trail(b, [
        (2, 1, [ok(b1)]),
        (3, 1, [refused(b1, "starts below"), ok(b2)]),
        (5, 2, [ok(b3), ok(b4)]),
        (6, 3, [ok(b5)]),
        (7, 3, [ok(b6), refused(b6, "starts below")]),
    ])
    expected = [
        block_dict(2, 1, b1),
        block_dict(3, 1, b2),
        block_dict(5, 2, b3),
        block_dict(5, 2, b4),
        block_dict(6, 3, b5),
        block_dict(7, 3, b6),
    ]
    assert list(iter_blocks([a, c, b])) == expected
    assert list(iter_blocks([b, a, c])) == expected
    assert list(iter_blocks([b])) == [e for e in expected]
    assert list(iter_blocks([c])) == [block_dict(5, 2, b3), block_dict(5, 2, b4), block_dict(6, 3, b5)]
    assert list(iter_blocks([a, a])) == [block_dict(2, 1, b1), block_dict(3, 1, b2)]


def test_iter_blocks_only_accepted_allocations(tmp_path):
    p = str(tmp_path / "a")
    write_trail(p, [
        (1, 1, [ok(reg()), refused(alloc(0), "stale")]),
        (2, 1, [ok(FenceBrokerRecord(broker_id=1, broker_epoch=1))]),
        ("gap", 5),
    ])
    assert list(iter_blocks([p])) == []
    assert list(iter_blocks([])) == []


def test_iter_blocks_output_fields(tmp_path):
    p = str(tmp_path / "a")
    rec = alloc(12345, length=7, broker_id=4, epoch=9)
    write_trail(p, [(8, 5, [ok(rec)])])
    assert list(iter_blocks([p])) == [{
        "raft_index": 8, "raft_term": 5, "broker_id": 4, "broker_epoch": 9, "producer_id_start": 12345,
        "producer_id_len": 7, "timestamp_ms": TS,
    }]


def test_iter_blocks_reads_a_trail_with_a_torn_tail_without_changing_it(tmp_path):
    p = str(tmp_path / "a")
    write_trail(p, [(1, 1, [ok(alloc(0))]), (2, 1, [ok(alloc(100))])])
    with open(p, "ab") as f:
        f.write(b"\x40\x00\x00\x00\x00")
    size = os.path.getsize(p)
    assert [b["raft_index"] for b in iter_blocks([p])] == [1, 2]
    assert os.path.getsize(p) == size


def test_iter_blocks_refuses_corrupt_trail(tmp_path):
    p = str(tmp_path / "a")
    write_trail(p, [(1, 1, [ok(alloc(0))]), (2, 1, [ok(alloc(100))])])
    flip(p, 4, 0x01)  # crc of the first line
    with pytest.raises(CorruptFileError):
        list(iter_blocks([p]))


# ------------------------------------------------------------ checkpoint
def test_reopen_reads_only_what_follows_the_checkpoint(path):
    write_trail(path, [(i, 1, [ok(alloc(i * 100))]) for i in range(1, 51)], checkpoint=True)
    synced = os.path.getsize(path)
    w = AuditWriter(path)
    assert w.last_index == 50
    assert w.scanned_bytes == 0  # nothing after the checkpoint to check
    w.append(51, 1, [ok(alloc(5100))])
    # written (AppendFile.write goes straight to the file), not synced: a crash now leaves one line after the checkpoint
    w2 = AuditWriter(path)
    assert w2.last_index == 51
    assert w2.scanned_bytes == os.path.getsize(path) - synced
    w2.close()
    assert [i for i, _ in indexes(path)] == list(range(1, 52))


def test_start_up_cost_does_not_grow_with_the_trail(path):
    write_trail(path, [(i, 1, [ok(alloc(i * 100))]) for i in range(1, 2001)], checkpoint=True)
    assert AuditWriter(path).scanned_bytes == 0
    os.remove(checkpoint_path(path))  # an old node without a checkpoint: one full scan, then a checkpoint
    w = AuditWriter(path)
    assert w.scanned_bytes == os.path.getsize(path) and w.last_index == 2000
    w.close()
    assert AuditWriter(path).scanned_bytes == 0


def test_file_shorter_than_its_checkpoint_refuses_to_start(path):
    write_trail(path, [(1, 1, [ok(reg())]), (2, 1, [ok(alloc(0))])], checkpoint=True)
    offsets = frame_offsets(path)
    with open(path, "r+b") as f:
        f.truncate(offsets[1])  # synced line 2 is gone
    with pytest.raises(CorruptFileError, match="were synced") as ei:
        AuditWriter(path)
    assert ei.value.path == path
    assert os.path.getsize(path) == offsets[1]  # nothing cut further


@pytest.mark.parametrize("damage", [b"", b"\x00" * 3, b"junk that is not a checkpoint at all"])
def test_damaged_checkpoint_falls_back_to_a_full_scan(path, damage, caplog):
    write_trail(path, [(1, 1, [ok(reg())]), (2, 1, [ok(alloc(0))])], checkpoint=True)
    with open(checkpoint_path(path), "wb") as f:
        f.write(damage)
    w = AuditWriter(path)
    assert w.last_index == 2 and w.scanned_bytes == os.path.getsize(path)
    assert "unusable" in caplog.text
    w.close()


def test_corruption_before_the_checkpoint_is_found_by_readers(path):
    write_trail(path, [(1, 1, [ok(reg())]), (2, 1, [ok(alloc(0))]), (3, 1, [ok(alloc(100))])], checkpoint=True)
    offsets = frame_offsets(path)
    flip(path, offsets[1] + 8 + 3, 0x01)
    # Start-up trusts the synced part (constant cost) ...
    AuditWriter(path).close()
    # ... every reader checks every line.
    with pytest.raises(CorruptFileError, match=f"offset {offsets[1]}"):
        read_audit(path)
    with pytest.raises(CorruptFileError):
        list(iter_blocks([path]))
