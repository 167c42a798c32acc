"""quorum.journal reopening damaged files: torn tails are cut, damage to what was durable is
corruption, loss is evidence; and the cuts and rebases Raft asks for.  Real files, no Raft."""
from __future__ import annotations

import os
import random

import pytest

from chaos.sim.disk import SimDisk
from quorum.journal import _ENTRY, MAGIC, UNKNOWN_INDEX, DurableJournal, MetaFile, encode_entry
from quorum.raft import loss_evidence
from snapshots.storage.disk import CorruptFileError
from tests.quorum.file_damage import flip
from tests.quorum.journal_files import DISK, ENTRIES, crash, cut, durable, entry_offsets, fill, journal, reopen, size


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
