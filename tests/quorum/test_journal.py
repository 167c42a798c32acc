"""Unit tests for quorum.journal (DurableJournal, MetaFile): real files in tmp_path through the real
``Disk``, and a ``SimDisk`` where a power loss must drop exactly what was not synced.  No Raft."""
from __future__ import annotations

import os
import random
import struct
import threading
import zlib

import msgpack
import pytest

from chaos.sim.disk import LossPolicy, NodeHalted, SimDisk
from quorum.journal import (
    _ENTRY,
    MAGIC,
    META_MAGIC,
    UNKNOWN_INDEX,
    DurableJournal,
    MetaFile,
    SyncThread,
    encode_entry,
    written_length,
)
from quorum.raft import loss_evidence
from snapshots.storage.disk import CorruptFileError, Disk, StorageFailure
from tests.quorum.file_damage import flip


@pytest.fixture
def path(tmp_path) -> str:
    return str(tmp_path / "raft.journal")


DISK = Disk(preallocate=0)  # files exactly as the entries were written (the format's tests); PREALLOCATED below
PREALLOCATED = Disk(preallocate=4096)

ENTRIES = [
    (b"first command", 1, 1),
    (bytes(range(256)), 2, 1),
    (b"\x00" * 5, 3, 2),
    (b"x" * 4000, 4, 2),
    (msgpack.packb([1, [[7, 0, [1]]]]), 5, 3),
]


def journal(path: str) -> DurableJournal:
    return DurableJournal(path, DISK)


def fill(j: DurableJournal, entries=ENTRIES) -> None:
    for e in entries:
        j.add(*e)


def crash(j: DurableJournal) -> None:
    """Drop the journal as a killed process would: no sync, no meta write."""
    j._file.close()


def reopen(j: DurableJournal) -> DurableJournal:
    crash(j)
    return journal(j.path)


def size(path: str) -> int:
    return os.path.getsize(path)


def entry_offsets(entries) -> list[int]:
    out, pos = [], len(MAGIC)
    for cmd, _, _ in entries:
        out.append(pos)
        pos += _ENTRY.size + len(cmd)
    return out


def cut(path: str, length: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(length)


def durable(j: DurableJournal, commit: int) -> None:
    """Record in the meta file that entries up to ``commit`` are committed (and the log end durable)."""
    j.setRaftCommitIndex(commit)
    j.onOneSecondTimer()


# --------------------------------------------------------------------------- basics
def test_new_journal_is_empty_with_default_meta(path):
    j = journal(path)
    assert len(j) == 0 and j.entries == []
    assert j.getCurrentTerm() == 0 and j.getVotedForNodeId() is None and j.getRaftCommitIndex() == 1
    assert j.syncs == 0 and not j.dirty and j.durable_end() == (0, 0)
    assert j.file_was_missing and j.meta_missing
    with open(path, "rb") as f:
        assert f.read() == MAGIC
    assert not os.path.exists(path + ".meta")
    j._destroy()


def test_add_sync_reopen_identical_entries(path):
    j = journal(path)
    fill(j)
    assert j.dirty and j.durable_end() == (0, 0)
    j.sync()
    assert not j.dirty and j.durable_end() == (3, 5)
    assert size(path) == len(MAGIC) + sum(_ENTRY.size + len(c) for c, _, _ in ENTRIES)
    j2 = reopen(j)
    assert j2.entries == ENTRIES and len(j2) == len(ENTRIES)
    assert j2[0] == ENTRIES[0] and j2[-1] == ENTRIES[-1] and j2.entry(3) == ENTRIES[2] and j2.entry(9) is None
    for (cmd, idx, term) in j2.entries:
        assert type(cmd) is bytes and type(idx) is int and type(term) is int
    j2._destroy()


def test_add_accepts_bytes_like_and_stores_bytes(path):
    j = journal(path)
    j.add(bytearray(b"abc"), 1, 1)
    j.add(memoryview(b"def"), 2, 1)
    assert j.entries == [(b"abc", 1, 1), (b"def", 2, 1)]
    j.sync()
    assert reopen(j).entries == [(b"abc", 1, 1), (b"def", 2, 1)]


def test_append_must_follow_the_last_entry(path):
    """The adapter appends only after the last entry, never a lower term: anything else is its bug."""
    j = journal(path)
    fill(j, ENTRIES[:3])
    for bad in [(b"gap", 5, 2), (b"again", 3, 2), (b"older term", 4, 1)]:
        with pytest.raises(AssertionError):
            j.add(*bad)


def test_empty_command_round_trips(path):
    j = journal(path)
    j.add(b"", 1, 1)
    j.add(b"after", 2, 1)
    j.sync()
    assert reopen(j).entries == [(b"", 1, 1), (b"after", 2, 1)]


def test_on_disk_entry_format(path):
    j = journal(path)
    j.add(b"cmd", 7, 3)
    j.sync()
    j._destroy()
    with open(path, "rb") as f:
        data = f.read()
    assert data[:len(MAGIC)] == MAGIC == b"PQJRNL\x00\x01"
    length, crc, index, term = struct.unpack_from("<IIQQ", data, len(MAGIC))
    assert (length, index, term) == (3, 7, 3)
    assert crc == zlib.crc32(b"cmd", zlib.crc32(struct.pack("<QQ", 7, 3)))
    assert encode_entry(b"cmd", 7, 3) == data[len(MAGIC):]


def test_pysyncobj_cuts_are_refused(path):
    """Log cuts are the adapter's (truncate_from, rebase): pysyncobj's own paths must never be reached."""
    j = journal(path)
    fill(j)
    for call in (j.clear, lambda: j.deleteEntriesFrom(1), lambda: j.deleteEntriesTo(1)):
        with pytest.raises(AssertionError, match="adapter"):
            call()
    assert j.entries == ENTRIES


# ------------------------------------------------------------ power loss (SimDisk)
def _three_synced_the_rest_in_the_page_cache():
    """A journal on a SimDisk holding ENTRIES: the first three synced, the rest written and never synced."""
    disk = SimDisk()
    disk.make_dir("/d")
    j = DurableJournal("/d/raft.journal", disk)
    fill(j, ENTRIES[:3])
    j.sync()
    fill(j, ENTRIES[3:])
    j._file.write(j._pending)  # in the page cache, never synced
    j._pending = bytearray()
    return disk, j


def test_unsynced_entries_are_lost_on_power_loss_and_synced_ones_never():
    disk, j = _three_synced_the_rest_in_the_page_cache()
    assert DurableJournal("/d/raft.journal", disk.power_loss()).entries == ENTRIES[:3]
    assert DurableJournal("/d/raft.journal", disk.crash()).entries == ENTRIES  # a process crash keeps them
    for seed in range(20):  # any prefix of the unsynced writes, the last torn: never less than the synced
        got = DurableJournal("/d/raft.journal", disk.power_loss(LossPolicy("random", random.Random(seed)))).entries
        assert got[:3] == ENTRIES[:3] and got == ENTRIES[:len(got)]


def test_entries_a_killed_process_left_unsynced_are_durable_once_the_journal_is_reopened():
    """kill -9 leaves unsynced writes in the page cache: the next start reads them, but a power loss before
    anything syncs the file takes them.  What the reopened journal reports as durable (its log end, sent to
    the peers) must survive that power loss (simulation seed 2137: a restarted leader's unsynced entry,
    reported held, lost at the next power loss, left a recovery target no node could reach)."""
    disk, j = _three_synced_the_rest_in_the_page_cache()
    crash(j)  # the process is killed: the same disk, its page cache kept
    reopened = DurableJournal("/d/raft.journal", disk)
    assert reopened.entries == ENTRIES
    assert reopened.durable_end() == (ENTRIES[-1][2], ENTRIES[-1][1])
    crash(reopened)
    after = DurableJournal("/d/raft.journal", disk.power_loss()).entries  # nothing unsynced survives
    assert after == ENTRIES


def test_every_crash_state_of_a_journal_write_keeps_the_synced_entries():
    """Before every file operation of appends, a Raft conflict cut and a rebase, each state a power loss
    can leave must hold every synced entry the operation in progress keeps (a cut drops what follows it,
    a rebase what precedes the snapshot's entries, deliberately)."""
    disk = SimDisk()
    disk.make_dir("/d")
    j = DurableJournal("/d/raft.journal", disk)
    fill(j, ENTRIES[:2])
    j.sync()
    keep = {"from": 1, "below": 1 << 62}
    states = []

    def check(op):
        durable_now = [e for e in j.entries[:j._durable] if keep["from"] <= e[1] < keep["below"]]
        for label, image in disk.crash_states():
            states.append(label)
            got = {e[1]: e for e in DurableJournal("/d/raft.journal", image).entries}
            for e in durable_now:
                assert got.get(e[1]) == e, f"{label}, before {op}: lost entry {e[1]}"

    disk.on_op = check
    fill(j, ENTRIES[2:4])
    j.sync()
    keep["below"] = 4
    j.truncate_from(4)
    keep["below"] = 1 << 62
    j.add(b"new four", 4, 3)
    j.sync()
    keep["from"] = 2
    j.rebase(ENTRIES[1], ENTRIES[2])
    disk.on_op = None
    assert len(states) > 10


# ------------------------------------------------------------------ preallocation
ONE = _ENTRY.size + 100  # an entry of a 100-byte command


def test_a_journal_is_grown_with_synced_zeros_ahead_of_its_entries_and_their_syncs_keep_its_length(path):
    j = DurableJournal(path, PREALLOCATED)
    assert size(path) == len(MAGIC)
    j.add(b"a" * 100, 1, 1)
    j.sync()
    assert size(path) == 2 * 4096  # a step of 4096 bytes, at least one whole step past the entry
    assert j._file.size == len(MAGIC) + ONE
    length = 2 * 4096
    for i in range(2, 100):
        j.add(b"a" * 100, i, 1)
        j.sync()
        written = len(MAGIC) + i * ONE
        if written > length:  # grown only when an entry would pass its length
            length = (written // 4096 + 2) * 4096
        assert size(path) == length
        with open(path, "rb") as f:
            data = f.read()
        assert data[written:] == bytes(len(data) - written)  # zeros after the last entry
        assert written_length(data) == written
    assert length > 2 * 4096 and j.syncs == 99  # the growths' syncs are not the journal's group commits
    j2 = reopen(j)
    assert len(j2) == 99 and j2.cut_on_open is None and size(path) == length


def test_zeros_after_the_last_entry_are_room_not_damage_and_appends_go_before_them(path):
    j = DurableJournal(path, PREALLOCATED)
    fill(j, ENTRIES[:3])
    j.sync()
    length = size(path)
    j2 = DurableJournal(reopen(j).path, PREALLOCATED)
    assert j2.entries == ENTRIES[:3] and j2.cut_on_open is None and size(path) == length
    fill(j2, ENTRIES[3:])
    j2.sync()
    crash(j2)
    j3 = DurableJournal(path, PREALLOCATED)
    assert j3.entries == ENTRIES and j3.cut_on_open is None


@pytest.mark.parametrize("torn", [1, _ENTRY.size - 1, _ENTRY.size + 3])
def test_a_torn_entry_in_the_room_is_cut_with_the_room(path, torn):
    j = DurableJournal(path, PREALLOCATED)
    fill(j, ENTRIES[:3])
    j.sync()
    good = j._file.size
    crash(j)
    with open(path, "r+b") as f:  # the start of a fourth entry landed in the zeros, the rest did not
        f.seek(good)
        f.write(encode_entry(b"x" * 50, 4, 2)[:torn])
    j2 = DurableJournal(path, PREALLOCATED)
    assert j2.entries == ENTRIES[:3] and "cut" in j2.cut_on_open and size(path) == good
    j2.add(b"again", 4, 3)
    j2.sync()
    assert size(path) > good
    crash(j2)
    assert DurableJournal(path, PREALLOCATED).entries == ENTRIES[:3] + [(b"again", 4, 3)]


def test_damage_of_synced_entries_in_a_preallocated_journal_is_corruption(path):
    j = DurableJournal(path, PREALLOCATED)
    fill(j)
    j.sync()
    durable(j, 5)
    crash(j)
    flip(path, entry_offsets(ENTRIES)[1] + _ENTRY.size + 7, 0xFF)
    with pytest.raises(CorruptFileError, match="synced data was damaged"):
        DurableJournal(path, PREALLOCATED)


def test_garbage_in_a_megabyte_of_room_is_cut_without_scanning_the_zeros(path):
    j = DurableJournal(path, Disk())  # the default step, 1 MiB
    fill(j)
    j.sync()
    good = j._file.size
    assert size(path) >= good + (1 << 20)
    crash(j)
    with open(path, "r+b") as f:
        f.seek(good + 100)
        f.write(b"garbage")
    j2 = DurableJournal(path, Disk())
    assert j2.entries == ENTRIES and size(path) == good


def test_a_full_disk_stops_the_node_when_the_journal_grows_before_an_entry_is_written():
    disk = SimDisk(preallocate=4096)
    disk.make_dir("/d")
    j = DurableJournal("/d/raft.journal", disk)
    fill(j, ENTRIES[:1])
    j.sync()
    disk.capacity = disk.used() + 100
    j.add(b"x" * 9000, 2, 1)  # past the first step
    with pytest.raises(NodeHalted) as stopped:
        j.sync()
    assert stopped.value.code == 74 and "disk full (ENOSPC)" in stopped.value.message
    writes = [op for op in disk.ops if op.kind == "write" and op.path == "/d/raft.journal"]
    assert writes[-1].detail.get("zeros") and j.durable_end() == (1, 1)
    assert DurableJournal("/d/raft.journal", disk.power_loss()).entries == ENTRIES[:1]


# ------------------------------------------------------- torn tails and corruption
@pytest.mark.parametrize("n_garbage", [1, 7, 23, 24, 25, 300])
def test_random_garbage_tail_is_cut_on_reopen(path, n_garbage):
    j = journal(path)
    fill(j)
    j.sync()
    good = size(path)
    crash(j)
    rng = random.Random(n_garbage)
    with open(path, "ab") as f:
        f.write(bytes(rng.randrange(256) for _ in range(n_garbage)))
    j2 = journal(path)
    assert j2.entries == ENTRIES and size(path) == good and "cut" in j2.cut_on_open
    j2.add(b"next", 6, 3)
    j2.sync()
    assert reopen(j2).entries == ENTRIES + [(b"next", 6, 3)]


@pytest.mark.parametrize("keep", [1, _ENTRY.size - 1, _ENTRY.size, _ENTRY.size + 4])
def test_last_entry_cut_short_is_cut_on_reopen(path, keep):
    j = journal(path)
    fill(j)
    j.sync()
    crash(j)
    last = entry_offsets(ENTRIES)[-1]
    cut(path, last + keep)
    j2 = journal(path)
    assert j2.entries == ENTRIES[:-1] and size(path) == last
    j2.add(b"replacement", 5, 4)
    j2.sync()
    assert reopen(j2).entries == ENTRIES[:-1] + [(b"replacement", 5, 4)]


def test_bad_last_entry_is_treated_as_torn_tail(path):
    j = journal(path)
    fill(j)
    j.sync()
    crash(j)
    flip(path, size(path) - 1, 0xFF)
    assert journal(path).entries == ENTRIES[:-1]


def test_only_entry_torn_leaves_usable_empty_journal(path):
    j = journal(path)
    j.add(b"only", 1, 1)
    j.sync()
    crash(j)
    cut(path, len(MAGIC) + 5)
    j2 = journal(path)
    assert j2.entries == [] and size(path) == len(MAGIC)


FIELDS = [0, 3, 4, 8, 16, _ENTRY.size, _ENTRY.size + 7]  # length, its high byte, crc, index, term, command bytes


@pytest.mark.parametrize("field_offset", FIELDS)
def test_damage_inside_what_was_durable_with_valid_entries_after_is_corruption(path, field_offset):
    j = journal(path)
    fill(j)
    durable(j, 5)
    crash(j)
    flip(path, entry_offsets(ENTRIES)[1] + field_offset, 0xFF)
    before = open(path, "rb").read()
    with pytest.raises(CorruptFileError) as ei:
        journal(path)
    assert ei.value.path == path and path in str(ei.value) and "synced data was damaged" in str(ei.value)
    assert open(path, "rb").read() == before  # nothing was cut


@pytest.mark.parametrize("field_offset", FIELDS)
def test_damage_beyond_what_was_durable_is_cut(path, field_offset):
    """Unsynced pages reach the disk in any order: a bad entry past the recorded durable end, even with
    valid-looking entries after it, is the tail of a crash."""
    j = journal(path)
    fill(j, ENTRIES[:1])
    durable(j, 1)  # the meta file records index 1 as durable ...
    fill(j, ENTRIES[1:])
    j.sync()  # ... the rest was synced after it (the meta is rewritten once a second)
    crash(j)
    flip(path, entry_offsets(ENTRIES)[3] + field_offset, 0xFF)
    assert journal(path).entries == ENTRIES[:3]


@pytest.mark.parametrize("second, problem", [((b"b", 3, 2), "has index 3, expected 2"),
                                             ((b"b", 2, 1), "has term 1 after term 2")])
def test_checksum_valid_entry_out_of_order_is_corruption(path, second, problem):
    """No crash leaves one (cuts are synced before anything follows, rewrites are whole files)."""
    with open(path, "wb") as f:
        f.write(MAGIC + encode_entry(b"a", 1, 2) + encode_entry(*second))
    with pytest.raises(CorruptFileError, match=problem) as ei:
        journal(path)
    assert path in str(ei.value)


def test_journal_shorter_than_its_durable_end_is_evidence_of_loss(path):
    j = journal(path)
    fill(j)
    durable(j, 5)
    j._destroy()
    cut(path, entry_offsets(ENTRIES)[3])  # entries 4 and 5, synced, are gone
    j2 = journal(path)
    assert j2.entries == ENTRIES[:3]
    found = loss_evidence(j2, None, True, "/d")
    assert found and max(t for t, _ in found) == (3, 5) and "recorded" in found[0][1]


@pytest.mark.parametrize("content", [
    b"XQJRNL\x00\x01" + encode_entry(b"a", 1, 1),
    b"PQJRNL\x00\x02" + encode_entry(b"a", 1, 1),
    b"XQJRNL\x00\x01",
], ids=["wrong", "version", "header-only"])
def test_bad_magic_is_corruption(path, content):
    with open(path, "wb") as f:
        f.write(content)
    with pytest.raises(CorruptFileError, match="not a pidquorum journal") as ei:
        journal(path)
    assert ei.value.path == path and path in str(ei.value)
    assert open(path, "rb").read() == content  # left alone for the operator


@pytest.mark.parametrize("content", [b"", MAGIC[:3], MAGIC[:-1], b"\x00" * 5],
                         ids=["empty", "short", "one-byte-short", "zeros"])
def test_headerless_journal_starts_empty_and_loss_is_judged_against_the_meta(path, content):
    with open(path, "wb") as f:
        f.write(content)
    j = journal(path)
    assert len(j) == 0 and not j.dirty and open(path, "rb").read() == MAGIC
    assert loss_evidence(j, None, True, "/d") == []  # nothing was ever recorded as durable
    j._file.close()
    with open(path, "wb") as f:
        f.write(content)
    MetaFile(path + ".meta", DISK).store({"term": 2, "voted_for": None, "commit_index": 4, "log_end": [2, 4]})
    found = loss_evidence(journal(path), None, True, "/d")
    assert max(t for t, _ in found) == (2, 4)


def test_missing_meta_with_a_log_is_evidence_the_vote_was_lost(path):
    j = journal(path)
    fill(j)
    j.sync()
    found = loss_evidence(j, None, False, "/d")
    assert found == [((3, UNKNOWN_INDEX), f"{path}.meta (term and vote) is missing")]


def test_identity_without_raft_files_is_evidence(path):
    j = journal(path)  # created now: there was no journal
    assert [reason for _, reason in loss_evidence(j, None, True, "/d")] == [
        "/d has an identity but lost its Raft files (raft.journal, raft.snapshot)"]
    assert loss_evidence(j, None, False, "/d") == []  # a new node


# --------------------------------------------------------------- cuts and rebase
def test_truncate_from_is_durable_before_anything_follows(tmp_path):
    disk = SimDisk()
    disk.make_dir("/d")
    j = DurableJournal("/d/raft.journal", disk)
    fill(j)
    j.sync()
    assert j.truncate_from(4) == 2
    assert j.durable_end() == (2, 3)
    # the cut is on disk already, before the new entry is even written
    assert DurableJournal("/d/raft.journal", disk.power_loss()).entries == ENTRIES[:3]
    j.add(b"new four", 4, 9)
    j.sync()
    assert DurableJournal("/d/raft.journal", disk.power_loss()).entries == ENTRIES[:3] + [(b"new four", 4, 9)]


def test_truncate_of_only_buffered_entries_writes_nothing(path):
    j = journal(path)
    fill(j, ENTRIES[:2])
    j.sync()
    fill(j, ENTRIES[2:])
    assert j.truncate_from(3) == 3
    j.add(b"three", 3, 4)
    j.sync()
    assert reopen(j).entries == ENTRIES[:2] + [(b"three", 3, 4)]


def test_truncate_outside_the_log_does_nothing(path):
    j = journal(path)
    fill(j)
    j.sync()
    assert j.truncate_from(6) == 0 and j.truncate_from(0) == 0
    assert j.entries == ENTRIES


def test_rebase_keeps_the_entries_after_a_matching_snapshot_entry(path):
    j = journal(path)
    fill(j)
    j.sync()
    assert j.rebase(ENTRIES[1], ENTRIES[2]) == 0
    assert j.entries == ENTRIES[1:]
    assert reopen(j).entries == ENTRIES[1:]


def test_rebase_on_a_conflicting_snapshot_drops_everything_after_it(path):
    j = journal(path)
    fill(j)
    j.sync()
    prev, last = (b"p", 3, 4), (b"l", 4, 4)  # the committed entry 4 has term 4, not 2
    assert j.rebase(prev, last) == 2  # entries 4 and 5 (held here, in term 2) were never committed
    assert j.entries == [prev, last]
    assert reopen(j).entries == [prev, last]


def test_rebase_past_the_end_of_the_log(path):
    j = journal(path)
    fill(j)
    assert j.rebase((b"p", 9, 5), (b"l", 10, 5)) == 0
    assert reopen(j).entries == [(b"p", 9, 5), (b"l", 10, 5)]


def test_rebase_writes_a_whole_new_file_and_keeps_pending_entries(path):
    j = journal(path)
    fill(j, ENTRIES[:4])
    j.sync()
    j.add(*ENTRIES[4])  # not yet synced
    j.rebase(ENTRIES[1], ENTRIES[2])
    assert not j.dirty and j.durable_end() == (3, 5)
    assert not os.path.exists(path + ".tmp")
    assert reopen(j).entries == ENTRIES[1:]


# ---------------------------------------------------------------------- metadata
def test_term_and_vote_persist_immediately(path):
    j = journal(path)
    j.setCurrentTerm(5, "127.0.0.1:7001")
    j2 = reopen(j)  # a crash right after: no timer, no _destroy
    assert (j2.getCurrentTerm(), j2.getVotedForNodeId()) == (5, "127.0.0.1:7001")
    j2.setCurrentTerm(6, None)
    j3 = reopen(j2)
    assert (j3.getCurrentTerm(), j3.getVotedForNodeId()) == (6, None)


def test_commit_index_and_log_end_persist_via_one_second_timer(path):
    j = journal(path)
    fill(j)
    j.setRaftCommitIndex(3)
    assert not j.dirty  # setRaftCommitIndex syncs the entries it covers first
    j.onOneSecondTimer()
    j2 = reopen(j)
    assert j2.getRaftCommitIndex() == 3 and j2.meta_log_end() == (3, 5) and j2.entries == ENTRIES


def test_commit_index_not_persisted_without_timer_or_destroy(path):
    j = journal(path)
    fill(j)
    j.setRaftCommitIndex(4)
    j2 = reopen(j)
    assert j2.getRaftCommitIndex() == 1 and j2.entries == ENTRIES


def test_commit_index_persists_via_destroy(path):
    j = journal(path)
    fill(j)
    j.setRaftCommitIndex(5)
    j._destroy()
    assert journal(path).getRaftCommitIndex() == 5


def test_clamp_commit_index(path):
    j = journal(path)
    fill(j)
    j.setRaftCommitIndex(5)
    j.clamp_commit_index(3)
    assert j.getRaftCommitIndex() == 3
    j.clamp_commit_index(9)
    assert j.getRaftCommitIndex() == 3


def test_recovery_target_is_durable_at_once(path):
    j = journal(path)
    j.set_recovery_target((4, 17))
    j2 = reopen(j)
    assert j2.recovery_target() == (4, 17)
    j2.set_recovery_target(None)
    assert reopen(j2).recovery_target() is None


def test_timer_without_changes_writes_nothing(path):
    j = journal(path)
    j.onOneSecondTimer()
    assert not os.path.exists(path + ".meta")
    j.setRaftCommitIndex(1)
    j.onOneSecondTimer()
    assert open(path + ".meta", "rb").read().startswith(META_MAGIC)
    os.remove(path + ".meta")
    j.setRaftCommitIndex(1)
    j.onOneSecondTimer()
    assert not os.path.exists(path + ".meta")


def test_meta_file_round_trip(tmp_path):
    m = MetaFile(str(tmp_path / "x.meta"), DISK)
    assert m.load() is None
    m.store({"term": 3, "voted_for": "a:1", "commit_index": 9, "log_end": (3, 9), "recover_to": None})
    assert m.load() == {"term": 3, "voted_for": "a:1", "commit_index": 9, "log_end": (3, 9), "recover_to": None}
    m.store({})
    assert m.load() == {"log_end": None, "recover_to": None}


def _corrupt_meta(path: str, how: str) -> None:
    meta = path + ".meta"
    with open(meta, "rb") as f:
        data = f.read()
    if how == "flip_body":
        data = data[:len(META_MAGIC) + 1] + bytes([data[len(META_MAGIC) + 1] ^ 0x40]) + data[len(META_MAGIC) + 2:]
    elif how == "flip_crc":
        data = data[:-1] + bytes([data[-1] ^ 1])
    elif how == "truncate":
        data = data[:-3]
    elif how == "tiny":
        data = data[:len(META_MAGIC) + 2]
    elif how == "magic":
        data = b"X" + data[1:]
    elif how == "empty":
        data = b""
    elif how == "not_a_map":
        body = msgpack.packb([1, 2, 3])
        data = META_MAGIC + body + struct.pack("<I", zlib.crc32(body))
    with open(meta, "wb") as f:
        f.write(data)


@pytest.mark.parametrize("how", ["flip_body", "flip_crc", "truncate", "tiny", "magic", "empty", "not_a_map"])
def test_corrupt_meta_file_is_refused_naming_meta_path(path, how):
    j = journal(path)
    j.setCurrentTerm(3, "127.0.0.1:7002")
    j._destroy()
    _corrupt_meta(path, how)
    with pytest.raises(CorruptFileError) as ei:
        journal(path)
    assert ei.value.path == path + ".meta" and (path + ".meta") in str(ei.value)


def _framed_meta(body: bytes) -> bytes:
    return META_MAGIC + body + struct.pack("<I", zlib.crc32(body))


@pytest.mark.parametrize("content", [
    random.Random(1).randbytes(64),
    _framed_meta(random.Random(2).randbytes(64)),
    _framed_meta(b"\xc1"),
    _framed_meta(msgpack.packb({"term": 1, "voted_for": None})[:-1]),
    _framed_meta(msgpack.packb({"term": 1}) + b"\x00"),
    _framed_meta(b"\xa3\xff\xfe\xfd"),
    _framed_meta(msgpack.packb({1: 2})),
    _framed_meta(msgpack.packb("term")),
    _framed_meta(msgpack.packb(7)),
    _framed_meta(msgpack.packb({"term": "3"})),
    _framed_meta(msgpack.packb({"term": 1.5})),
    _framed_meta(msgpack.packb({"term": True})),
    _framed_meta(msgpack.packb({"term": -1})),
    _framed_meta(msgpack.packb({"commit_index": None})),
    _framed_meta(msgpack.packb({"commit_index": [4]})),
    _framed_meta(msgpack.packb({"voted_for": 7})),
    _framed_meta(msgpack.packb({"voted_for": b"127.0.0.1:7002"}, use_bin_type=True)),
    _framed_meta(msgpack.packb({"log_end": [1]})),
    _framed_meta(msgpack.packb({"recover_to": [1, -2]})),
    _framed_meta(msgpack.packb({"recover_to": "x"})),
], ids=["random", "random-body", "c1", "truncated", "extra", "utf8", "int-key", "str", "int", "term-str",
        "term-float", "term-bool", "term-negative", "commit-nil", "commit-list", "vote-int", "vote-bytes",
        "log-end-short", "recover-negative", "recover-str"])
def test_malformed_meta_file_is_corrupt_file_error(tmp_path, content):
    path = str(tmp_path / "raft.journal.meta")
    with open(path, "wb") as f:
        f.write(content)
    with pytest.raises(CorruptFileError) as ei:
        MetaFile(path, DISK).load()
    assert ei.value.path == path


def test_meta_file_garbage_bodies_only_raise_corrupt_file_error(tmp_path):
    path = str(tmp_path / "raft.journal.meta")
    rng = random.Random(0x3E7A)
    for _ in range(1000):
        with open(path, "wb") as f:
            f.write(_framed_meta(rng.randbytes(rng.randrange(0, 24))))
        try:
            assert isinstance(MetaFile(path, DISK).load(), dict)
        except CorruptFileError as e:
            assert e.path == path


# --------------------------------------------------------------------- group commit
def test_sync_counts_only_when_something_is_pending(path):
    j = journal(path)
    j.sync()
    assert j.syncs == 0
    j.add(b"a", 1, 1)
    j.sync()
    assert j.syncs == 1
    j.sync()
    j.flush()
    assert j.syncs == 1
    fill(j, [(b"b", 2, 1), (b"c", 3, 1), (b"d", 4, 1)])
    j.sync()
    assert j.syncs == 2  # one sync for the whole group
    j.setRaftCommitIndex(2)
    j.onOneSecondTimer()
    assert j.syncs == 2


def test_add_only_buffers_until_sync(path):
    j = journal(path)
    fill(j)
    assert size(path) == len(MAGIC) and j.dirty
    j.sync()
    assert size(path) > len(MAGIC)


def test_set_commit_index_syncs_pending_entries(path):
    j = journal(path)
    fill(j)
    j.setRaftCommitIndex(2)
    assert j.syncs == 1 and not j.dirty
    assert size(path) == len(MAGIC) + sum(_ENTRY.size + len(c) for c, _, _ in ENTRIES)


# ------------------------------------------------- a sync begun, collected later
def sim_journal() -> tuple[SimDisk, DurableJournal]:
    disk = SimDisk()
    disk.make_dir("/d")
    return disk, DurableJournal("/d/raft.journal", disk)


def test_a_sync_begun_counts_only_once_collected_and_a_power_loss_before_that_loses_its_entries():
    disk, j = sim_journal()
    fill(j, ENTRIES[:2])
    j.sync()
    fill(j, ENTRIES[2:])
    j.start_sync()  # written; the fdatasync not waited for (the default Syncer: not run before a wait)
    assert j.durable_end() == (1, 2) and j.dirty
    assert not j._pending and [op.kind for op in disk.ops][-1] == "write"
    assert DurableJournal("/d/raft.journal", disk.power_loss()).entries == ENTRIES[:2]
    j.start_sync()  # one in flight: nothing new to write, nothing else started
    assert [op.kind for op in disk.ops][-1] == "write"
    j.sync()  # collects it
    assert j.durable_end() == (3, 5) and not j.dirty and j.syncs == 2
    assert DurableJournal("/d/raft.journal", disk.power_loss()).entries == ENTRIES


@pytest.mark.parametrize("cut", ["truncate_from", "rebase", "setRaftCommitIndex", "_store_meta"])
def test_whatever_relies_on_the_log_or_changes_the_file_collects_the_sync_in_flight_first(cut):
    disk, j = sim_journal()
    fill(j)
    j.start_sync()
    kinds = len(disk.ops)
    {"truncate_from": lambda: j.truncate_from(4), "rebase": lambda: j.rebase(ENTRIES[2], ENTRIES[3]),
     "setRaftCommitIndex": lambda: j.setRaftCommitIndex(5), "_store_meta": j._store_meta}[cut]()
    assert disk.ops[kinds].kind == "fdatasync" and disk.ops[kinds].path == "/d/raft.journal"
    assert j._inflight is None
    durable = [e for e in DurableJournal("/d/raft.journal", disk.power_loss()).entries]
    assert durable == j.entries  # what the journal holds after the operation is all durable


def test_on_the_sync_thread_the_entries_count_once_the_fdatasync_returned(path):
    j = journal(path)
    j.syncer = SyncThread("test-sync")
    try:
        release, running = threading.Event(), threading.Event()
        real = j._file.sync

        def slow_sync():
            running.set()
            assert release.wait(5)
            real()
        j._file.sync = slow_sync
        fill(j)
        j.start_sync()
        assert running.wait(5)  # the fdatasync runs on the other thread, this one goes on
        j.start_sync()
        assert j.durable_end() == (0, 0) and j.dirty  # nothing counts while it is in flight
        release.set()
        j.sync()
        assert j.durable_end() == (3, 5) and not j.dirty and j.syncs == 1
    finally:
        j.syncer.close()


def test_a_sync_that_failed_in_flight_fails_where_it_is_collected_and_counts_nothing(path):
    j = journal(path)
    j.syncer = SyncThread("test-sync")
    try:
        def failing_sync():
            raise StorageFailure("fdatasync", path, OSError(5, "Input/output error"))
        j._file.sync = failing_sync
        fill(j)
        j.start_sync()
        with pytest.raises(StorageFailure):
            j.sync()
        assert j.durable_end() == (0, 0) and j.dirty
    finally:
        j.syncer.close()
