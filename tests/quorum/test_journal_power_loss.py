"""quorum.journal under power loss and kills: a ``SimDisk`` where a power loss must drop exactly what
was not synced, preallocated room, and when a sync (grouped or in flight) counts.  No Raft."""
from __future__ import annotations

import random
import threading

import pytest

from chaos.sim.disk import LossPolicy, NodeHalted, SimDisk
from quorum.journal import _ENTRY, MAGIC, DurableJournal, SyncThread, encode_entry, written_length
from snapshots.storage.disk import CorruptFileError, Disk, StorageFailure
from tests.quorum.file_damage import flip
from tests.quorum.journal_files import ENTRIES, PREALLOCATED, crash, durable, entry_offsets, fill, journal, reopen, size


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
