"""Unit tests for quorum.journal (DurableJournal, MetaFile): the entry format, appends, and the meta
file (term, vote, commit index, recovery target).  Real files in tmp_path through the real ``Disk``; no Raft.
Power loss and syncing are in test_journal_power_loss, torn tails, corruption, cuts and rebase in
test_journal_recovery."""
from __future__ import annotations

import os
import random
import struct
import zlib

import msgpack
import pytest

from quorum.journal import _ENTRY, MAGIC, META_MAGIC, MetaFile, encode_entry
from snapshots.storage.disk import CorruptFileError
from tests.quorum.journal_files import DISK, ENTRIES, fill, journal, reopen, size


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
