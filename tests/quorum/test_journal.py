"""Unit tests for quorum.journal (DurableJournal, MetaFile) on files in tmp_path.

No Raft and no network; every test opens, damages and reopens real files.
"""
from __future__ import annotations

import os
import random
import struct
import zlib

import msgpack
import pytest

from quorum.errors import CorruptFileError
from quorum.journal import (
    _ENTRY,
    MAGIC,
    META_MAGIC,
    NO_FSYNC_ENV,
    SIMULATE_ENV,
    DurableJournal,
    MetaFile,
    encode_entry,
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv(SIMULATE_ENV, raising=False)
    monkeypatch.delenv(NO_FSYNC_ENV, raising=False)


@pytest.fixture
def path(tmp_path) -> str:
    return str(tmp_path / "raft.journal")


ENTRIES = [
    (b"first command", 1, 1),
    (bytes(range(256)), 2, 1),
    (b"\x00" * 5, 3, 2),
    (b"x" * 4000, 4, 2),
    (msgpack.packb([1, [[7, 0, [1]]]]), 5, 3),
]


def fill(j: DurableJournal, entries=ENTRIES) -> None:
    for e in entries:
        j.add(*e)


def crash(j: DurableJournal) -> None:
    """Drop the journal as a killed process would: no sync, no meta write."""
    os.close(j._fd)


def reopen(j: DurableJournal) -> DurableJournal:
    crash(j)
    return DurableJournal(j.path)


def size(path: str) -> int:
    return os.path.getsize(path)


def entry_offsets(entries) -> list[int]:
    out, pos = [], len(MAGIC)
    for cmd, _, _ in entries:
        out.append(pos)
        pos += _ENTRY.size + len(cmd)
    return out


def flip(path: str, offset: int, mask: int = 0xFF) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([b ^ mask]))


def cut(path: str, length: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(length)


# --------------------------------------------------------------------------
# basics
# --------------------------------------------------------------------------


def test_new_journal_is_empty_with_default_meta(path):
    j = DurableJournal(path)
    assert len(j) == 0 and j.entries == []
    assert j.getCurrentTerm() == 0
    assert j.getVotedForNodeId() is None
    assert j.getRaftCommitIndex() == 1
    assert j.syncs == 0 and not j.dirty
    with open(path, "rb") as f:
        assert f.read() == MAGIC
    assert not os.path.exists(path + ".meta")
    j._destroy()


def test_add_sync_reopen_identical_entries(path):
    j = DurableJournal(path)
    fill(j)
    assert j.dirty
    j.sync()
    assert not j.dirty
    assert size(path) == len(MAGIC) + sum(_ENTRY.size + len(c) for c, _, _ in ENTRIES)
    j2 = reopen(j)
    assert j2.entries == ENTRIES
    assert len(j2) == len(ENTRIES)
    assert j2[0] == ENTRIES[0] and j2[-1] == ENTRIES[-1]
    for (cmd, idx, term) in j2.entries:
        assert type(cmd) is bytes and type(idx) is int and type(term) is int
    j2._destroy()


def test_add_accepts_bytes_like_and_stores_bytes(path):
    j = DurableJournal(path)
    j.add(bytearray(b"abc"), 1, 1)
    j.add(memoryview(b"def"), 2, 1)
    assert j.entries == [(b"abc", 1, 1), (b"def", 2, 1)]
    assert all(type(c) is bytes for c, _, _ in j.entries)
    j.sync()
    j2 = reopen(j)
    assert j2.entries == [(b"abc", 1, 1), (b"def", 2, 1)]
    j2._destroy()


def test_empty_command_round_trips(path):
    j = DurableJournal(path)
    j.add(b"", 1, 1)
    j.add(b"after", 2, 1)
    j.sync()
    j2 = reopen(j)
    assert j2.entries == [(b"", 1, 1), (b"after", 2, 1)]
    j2._destroy()


def test_on_disk_entry_format(path):
    j = DurableJournal(path)
    j.add(b"cmd", 7, 3)
    j.sync()
    j._destroy()
    with open(path, "rb") as f:
        data = f.read()
    assert data[:len(MAGIC)] == MAGIC == b"PQJRNL\x00\x01"
    length, crc, index, term = struct.unpack_from("<IIQQ", data, len(MAGIC))
    assert (length, index, term) == (3, 7, 3)
    assert crc == zlib.crc32(b"cmd", zlib.crc32(struct.pack("<QQ", 7, 3)))
    assert data[len(MAGIC) + 24:] == b"cmd"
    assert encode_entry(b"cmd", 7, 3) == data[len(MAGIC):]


def test_entries_survive_several_reopens_and_appends(path):
    j = DurableJournal(path)
    fill(j, ENTRIES[:2])
    j.sync()
    j = reopen(j)
    fill(j, ENTRIES[2:])
    j.sync()
    j = reopen(j)
    assert j.entries == ENTRIES
    j._destroy()


# --------------------------------------------------------------------------
# durability: only synced entries survive a power loss
# --------------------------------------------------------------------------


def test_unsynced_entries_are_lost_on_power_loss(path, monkeypatch):
    monkeypatch.setenv(SIMULATE_ENV, "1")
    j = DurableJournal(path)
    synced_file = path + ".synced"
    with open(synced_file) as f:
        assert int(f.read()) == len(MAGIC)
    fill(j, ENTRIES[:3])
    j.sync()
    with open(synced_file) as f:
        synced = int(f.read())
    assert synced == size(path) == len(MAGIC) + sum(_ENTRY.size + len(c) for c, _, _ in ENTRIES[:3])
    fill(j, ENTRIES[3:])  # added, never synced
    # What the page cache might hold at the moment of the power loss: the
    # unsynced entries written out, but not on stable storage.
    with open(path, "ab") as f:
        for e in ENTRIES[3:]:
            f.write(encode_entry(*e))
    assert size(path) > synced
    crash(j)
    with open(synced_file) as f:
        assert int(f.read()) == synced  # no sync happened since
    cut(path, synced)
    j2 = DurableJournal(path)
    assert j2.entries == ENTRIES[:3]
    j2._destroy()


def test_synced_marker_only_written_when_simulating(path):
    j = DurableJournal(path)
    fill(j)
    j.sync()
    j._destroy()
    assert not os.path.exists(path + ".synced")


def test_synced_marker_tracks_deletes_and_compaction(path, monkeypatch):
    monkeypatch.setenv(SIMULATE_ENV, "1")
    j = DurableJournal(path)
    fill(j)
    j.sync()
    j.deleteEntriesFrom(3)
    j.sync()
    with open(path + ".synced") as f:
        assert int(f.read()) == size(path)
    j.deleteEntriesTo(1)
    with open(path + ".synced") as f:
        assert int(f.read()) == size(path)
    j._destroy()


# --------------------------------------------------------------------------
# torn tails are cut; corruption is refused
# --------------------------------------------------------------------------


@pytest.mark.parametrize("n_garbage", [1, 7, 23, 24, 25, 300])
def test_random_garbage_tail_is_cut_on_reopen(path, n_garbage):
    j = DurableJournal(path)
    fill(j)
    j.sync()
    good = size(path)
    crash(j)
    rng = random.Random(n_garbage)
    with open(path, "ab") as f:
        f.write(bytes(rng.randrange(256) for _ in range(n_garbage)))
    j2 = DurableJournal(path)
    assert j2.entries == ENTRIES
    assert size(path) == good
    # Still usable: append, sync, reopen.
    j2.add(b"next", 6, 3)
    j2.sync()
    j3 = reopen(j2)
    assert j3.entries == ENTRIES + [(b"next", 6, 3)]
    j3._destroy()


@pytest.mark.parametrize("keep", [1, _ENTRY.size - 1, _ENTRY.size, _ENTRY.size + 4])
def test_last_entry_cut_short_is_cut_on_reopen(path, keep):
    j = DurableJournal(path)
    fill(j)
    j.sync()
    crash(j)
    last = entry_offsets(ENTRIES)[-1]
    assert last + keep < size(path)
    cut(path, last + keep)
    j2 = DurableJournal(path)
    assert j2.entries == ENTRIES[:-1]
    assert size(path) == last
    j2.add(b"replacement", 5, 4)
    j2.sync()
    j3 = reopen(j2)
    assert j3.entries == ENTRIES[:-1] + [(b"replacement", 5, 4)]
    j3._destroy()


def test_bad_last_entry_is_treated_as_torn_tail(path):
    j = DurableJournal(path)
    fill(j)
    j.sync()
    crash(j)
    flip(path, size(path) - 1)  # last byte of the last command
    j2 = DurableJournal(path)
    assert j2.entries == ENTRIES[:-1]
    j2._destroy()


def test_only_entry_torn_leaves_usable_empty_journal(path):
    j = DurableJournal(path)
    j.add(b"only", 1, 1)
    j.sync()
    crash(j)
    cut(path, len(MAGIC) + 5)
    j2 = DurableJournal(path)
    assert j2.entries == []
    assert size(path) == len(MAGIC)
    j2._destroy()


@pytest.mark.parametrize("field_offset", [
    0,                    # length
    3,                    # length, high byte
    4,                    # crc
    8,                    # index
    16,                   # term
    _ENTRY.size,          # first command byte
    _ENTRY.size + 7,      # a later command byte
])
def test_flipped_byte_with_valid_entries_after_is_corruption(path, field_offset):
    j = DurableJournal(path)
    fill(j)
    j.sync()
    crash(j)
    flip(path, entry_offsets(ENTRIES)[1] + field_offset)
    before = open(path, "rb").read()
    with pytest.raises(CorruptFileError) as ei:
        DurableJournal(path)
    assert ei.value.path == path
    assert path in str(ei.value)
    assert "corrupt" in str(ei.value)
    assert open(path, "rb").read() == before  # nothing was cut


def test_non_consecutive_indexes_are_corruption(path):
    with open(path, "wb") as f:
        f.write(MAGIC + encode_entry(b"a", 1, 1) + encode_entry(b"b", 3, 1))
    with pytest.raises(CorruptFileError, match="has index 3, expected 2") as ei:
        DurableJournal(path)
    assert path in str(ei.value)


def test_torn_tail_below_commit_index_is_corruption(path):
    j = DurableJournal(path)
    fill(j)
    j.setRaftCommitIndex(5)
    j.onOneSecondTimer()
    crash(j)
    cut(path, entry_offsets(ENTRIES)[-1] + 10)  # entry 5, committed, is torn
    with pytest.raises(CorruptFileError, match="lose committed entries") as ei:
        DurableJournal(path)
    assert path in str(ei.value)


def test_torn_tail_above_commit_index_is_cut(path):
    j = DurableJournal(path)
    fill(j)
    j.setRaftCommitIndex(4)
    j.onOneSecondTimer()
    crash(j)
    cut(path, entry_offsets(ENTRIES)[-1] + 10)  # entry 5 is not committed
    j2 = DurableJournal(path)
    assert j2.entries == ENTRIES[:-1]
    assert j2.getRaftCommitIndex() == 4
    j2._destroy()


def test_torn_tail_losing_several_committed_entries_is_corruption(path):
    j = DurableJournal(path)
    fill(j)
    j.setRaftCommitIndex(5)
    j._destroy()
    cut(path, entry_offsets(ENTRIES)[3] + _ENTRY.size + 100)  # entry 4 torn, entry 5 gone
    with pytest.raises(CorruptFileError):
        DurableJournal(path)


def test_torn_first_entry_after_compaction_below_commit_index_is_corruption(path):
    j = DurableJournal(path)
    fill(j)
    j.setRaftCommitIndex(5)
    # pysyncobj compacts up to the snapshot's last entry (index 3 here) and keeps it:
    # entries 4 and 5 are committed and exist only in this journal (and on peers).
    j.deleteEntriesTo(2)
    assert [e[1] for e in j.entries] == [3, 4, 5]
    j._destroy()
    cut(path, len(MAGIC) + 10)  # the tear starts inside entry 3; 4 and 5 are gone
    with pytest.raises(CorruptFileError):
        DurableJournal(path)


@pytest.mark.parametrize("content", [
    b"XQJRNL\x00\x01" + encode_entry(b"a", 1, 1),   # wrong magic
    b"PQJRNL\x00\x02" + encode_entry(b"a", 1, 1),   # unknown journal version
    b"\x00" * 64,
    b"XQJRNL\x00\x01",                              # just a wrong header
], ids=["wrong", "version", "zeros", "header-only"])
def test_bad_magic_is_corruption(path, content):
    with open(path, "wb") as f:
        f.write(content)
    with pytest.raises(CorruptFileError, match="not a pidquorum journal") as ei:
        DurableJournal(path)
    assert ei.value.path == path
    assert path in str(ei.value)
    assert open(path, "rb").read() == content  # left alone for the operator


HEADERLESS = [b"", MAGIC[:3], MAGIC[:-1], b"\x00" * 5]
HEADERLESS_IDS = ["empty", "short", "one-byte-short", "zeros"]


@pytest.mark.parametrize("content", HEADERLESS, ids=HEADERLESS_IDS)
@pytest.mark.parametrize("meta", [None, {}, {"term": 2, "voted_for": "127.0.0.1:7002"}],
                         ids=["no-meta", "empty-meta", "term-and-vote"])
def test_headerless_journal_with_nothing_durable_starts_fresh(path, content, meta, caplog):
    """A crash between creating the journal and syncing its header leaves a file that
    cannot hold an entry; with no durable commit index, the node starts on a fresh one."""
    with open(path, "wb") as f:
        f.write(content)
    if meta is not None:
        MetaFile(path + ".meta").store(meta)
    with caplog.at_level("WARNING", logger="quorum.journal"):
        j = DurableJournal(path)
    assert f"{len(content)} bytes, shorter than its header" in caplog.text and "fresh journal" in caplog.text
    assert len(j) == 0 and not j.dirty
    assert j.getCurrentTerm() == (meta or {}).get("term", 0)
    with open(path, "rb") as f:
        assert f.read() == MAGIC
    fill(j)
    j.sync()
    j2 = reopen(j)
    assert j2.entries == ENTRIES
    j2._destroy()


@pytest.mark.parametrize("content", HEADERLESS, ids=HEADERLESS_IDS)
def test_headerless_journal_with_durable_commit_index_is_refused(path, content):
    MetaFile(path + ".meta").store({"term": 2, "voted_for": None, "commit_index": 4})
    with open(path, "wb") as f:
        f.write(content)
    with pytest.raises(CorruptFileError, match="shorter than the journal header") as ei:
        DurableJournal(path)
    assert ei.value.path == path
    assert path in str(ei.value) and "index 4" in str(ei.value)
    assert open(path, "rb").read() == content  # left alone for the operator


# --------------------------------------------------------------------------
# deleting entries
# --------------------------------------------------------------------------


def test_delete_entries_from_then_reopen(path):
    j = DurableJournal(path)
    fill(j)
    j.sync()
    j.deleteEntriesFrom(3)
    assert j.entries == ENTRIES[:3]
    j.sync()
    j2 = reopen(j)
    assert j2.entries == ENTRIES[:3]
    assert size(path) == entry_offsets(ENTRIES)[3]
    # A new leader's entries replace the deleted ones.
    j2.add(b"new-4", 4, 9)
    j2.sync()
    j3 = reopen(j2)
    assert j3.entries == ENTRIES[:3] + [(b"new-4", 4, 9)]
    j3._destroy()


def test_delete_entries_from_with_unsynced_entries(path):
    j = DurableJournal(path)
    fill(j, ENTRIES[:2])
    j.sync()
    fill(j, ENTRIES[2:])  # pending
    j.deleteEntriesFrom(3)
    j.add(b"new-4", 4, 9)
    j.sync()
    j2 = reopen(j)
    assert j2.entries == ENTRIES[:3] + [(b"new-4", 4, 9)]
    j2._destroy()


def test_delete_entries_from_zero_and_past_end(path):
    j = DurableJournal(path)
    fill(j)
    j.sync()
    j.deleteEntriesFrom(len(ENTRIES))  # no-op
    j.deleteEntriesFrom(len(ENTRIES) + 3)  # no-op
    assert j.entries == ENTRIES
    assert not j.dirty
    j.deleteEntriesFrom(0)
    assert j.entries == []
    j.sync()
    j2 = reopen(j)
    assert j2.entries == []
    assert size(path) == len(MAGIC)
    j2._destroy()


@pytest.mark.parametrize("n", [0, 1, 3, 5])
def test_delete_entries_to_compaction_then_reopen(path, n):
    j = DurableJournal(path)
    fill(j)
    j.sync()
    j.deleteEntriesTo(n)
    assert j.entries == ENTRIES[n:]
    assert not j.dirty
    j2 = reopen(j)
    assert j2.entries == ENTRIES[n:]
    assert size(path) == len(MAGIC) + sum(_ENTRY.size + len(c) for c, _, _ in ENTRIES[n:])
    j2.add(b"six", 6, 3)
    j2.sync()
    j3 = reopen(j2)
    assert j3.entries == ENTRIES[n:] + [(b"six", 6, 3)]
    j3._destroy()


def test_delete_entries_to_syncs_pending_entries_first(path):
    j = DurableJournal(path)
    fill(j)  # never explicitly synced
    j.deleteEntriesTo(2)
    j2 = reopen(j)
    assert j2.entries == ENTRIES[2:]
    j2._destroy()


def test_delete_entries_to_then_from(path):
    j = DurableJournal(path)
    fill(j)
    j.deleteEntriesTo(2)         # entries 3, 4, 5
    j.deleteEntriesFrom(1)       # keep entry 3 (list positions are relative to what is kept)
    assert j.entries == ENTRIES[2:3]
    j.add(b"four", 4, 5)
    j.sync()
    j2 = reopen(j)
    assert j2.entries == [ENTRIES[2], (b"four", 4, 5)]
    j2._destroy()


def test_clear(path):
    j = DurableJournal(path)
    fill(j)
    j.sync()
    j.clear()
    assert j.entries == [] and len(j) == 0
    j.sync()
    j2 = reopen(j)
    assert j2.entries == []
    assert size(path) == len(MAGIC)
    j2.add(b"fresh", 10, 4)
    j2.sync()
    j3 = reopen(j2)
    assert j3.entries == [(b"fresh", 10, 4)]
    j3._destroy()


def test_clear_with_pending_entries(path):
    j = DurableJournal(path)
    fill(j)
    j.clear()
    j.add(b"fresh", 1, 1)
    j.sync()
    j2 = reopen(j)
    assert j2.entries == [(b"fresh", 1, 1)]
    j2._destroy()


# --------------------------------------------------------------------------
# metadata
# --------------------------------------------------------------------------


def test_term_and_vote_persist_immediately(path):
    j = DurableJournal(path)
    j.setCurrentTerm(5, "127.0.0.1:7001")
    assert (j.getCurrentTerm(), j.getVotedForNodeId()) == (5, "127.0.0.1:7001")
    j2 = reopen(j)  # a crash right after: no timer, no _destroy
    assert (j2.getCurrentTerm(), j2.getVotedForNodeId()) == (5, "127.0.0.1:7001")
    j2.setCurrentTerm(6, None)
    j3 = reopen(j2)
    assert (j3.getCurrentTerm(), j3.getVotedForNodeId()) == (6, None)
    j3._destroy()


def test_commit_index_persists_via_one_second_timer(path):
    j = DurableJournal(path)
    fill(j)
    j.setRaftCommitIndex(3)
    assert j.getRaftCommitIndex() == 3
    assert not j.dirty  # setRaftCommitIndex syncs the entries it covers first
    j.onOneSecondTimer()
    j2 = reopen(j)
    assert j2.getRaftCommitIndex() == 3
    assert j2.entries == ENTRIES
    j2._destroy()


def test_commit_index_not_persisted_without_timer_or_destroy(path):
    j = DurableJournal(path)
    fill(j)
    j.setRaftCommitIndex(4)
    j2 = reopen(j)
    assert j2.getRaftCommitIndex() == 1  # the default: the hint was never written
    assert j2.entries == ENTRIES        # but the entries were synced
    j2._destroy()


def test_commit_index_persists_via_destroy(path):
    j = DurableJournal(path)
    fill(j)
    j.setRaftCommitIndex(5)
    j._destroy()
    j2 = DurableJournal(path)
    assert j2.getRaftCommitIndex() == 5
    assert j2.entries == ENTRIES
    j2._destroy()


def test_timer_without_changes_writes_nothing(path):
    j = DurableJournal(path)
    j.onOneSecondTimer()
    assert not os.path.exists(path + ".meta")
    j.setRaftCommitIndex(1)  # equal to the default, but not stored yet: dirty
    j.onOneSecondTimer()
    assert os.path.exists(path + ".meta")
    assert open(path + ".meta", "rb").read().startswith(META_MAGIC)
    os.remove(path + ".meta")
    j.setRaftCommitIndex(1)  # unchanged now: not dirty
    j.onOneSecondTimer()
    assert not os.path.exists(path + ".meta")
    j._destroy()


def test_meta_file_round_trip(tmp_path):
    m = MetaFile(str(tmp_path / "x.meta"))
    assert m.load() == {}
    m.store({"term": 3, "voted_for": "a:1", "commit_index": 9})
    assert m.load() == {"term": 3, "voted_for": "a:1", "commit_index": 9}
    m.store({})
    assert m.load() == {}


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
    j = DurableJournal(path)
    j.setCurrentTerm(3, "127.0.0.1:7002")
    j._destroy()
    _corrupt_meta(path, how)
    with pytest.raises(CorruptFileError) as ei:
        DurableJournal(path)
    assert ei.value.path == path + ".meta"
    assert (path + ".meta") in str(ei.value)


def _framed_meta(body: bytes) -> bytes:
    """A meta file whose header and checksum are right, around any body."""
    return META_MAGIC + body + struct.pack("<I", zlib.crc32(body))


@pytest.mark.parametrize("content", [
    random.Random(1).randbytes(64),                                # random bytes, no header
    _framed_meta(random.Random(2).randbytes(64)),                  # random body, valid checksum
    _framed_meta(b"\xc1"),                                         # never-used msgpack byte
    _framed_meta(msgpack.packb({"term": 1, "voted_for": None})[:-1]),  # truncated msgpack
    _framed_meta(msgpack.packb({"term": 1}) + b"\x00"),            # trailing data
    _framed_meta(b"\xa3\xff\xfe\xfd"),                             # invalid UTF-8 string
    _framed_meta(msgpack.packb({1: 2})),                           # non-string key
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
], ids=["random", "random-body", "c1", "truncated", "extra", "utf8", "int-key", "str", "int", "term-str",
        "term-float", "term-bool", "term-negative", "commit-nil", "commit-list", "vote-int", "vote-bytes"])
def test_malformed_meta_file_is_corrupt_file_error(tmp_path, content):
    path = str(tmp_path / "raft.journal.meta")
    with open(path, "wb") as f:
        f.write(content)
    with pytest.raises(CorruptFileError) as ei:
        MetaFile(path).load()
    assert ei.value.path == path


def test_meta_file_garbage_bodies_only_raise_corrupt_file_error(tmp_path):
    """Checksum-valid random bodies: either a meta map loads or CorruptFileError, nothing else."""
    path = str(tmp_path / "raft.journal.meta")
    rng = random.Random(0x3E7A)
    for _ in range(1000):
        with open(path, "wb") as f:
            f.write(_framed_meta(rng.randbytes(rng.randrange(0, 24))))
        try:
            assert isinstance(MetaFile(path).load(), dict)
        except CorruptFileError as e:
            assert e.path == path


# --------------------------------------------------------------------------
# group commit
# --------------------------------------------------------------------------


def test_sync_counts_only_when_something_is_pending(path):
    j = DurableJournal(path)
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
    assert j.syncs == 2  # nothing pending
    j.deleteEntriesFrom(2)
    assert j.dirty
    j.sync()
    assert j.syncs == 3  # the new size must be made durable
    j.sync()
    assert j.syncs == 3
    j._destroy()


def test_add_only_buffers_until_sync(path):
    j = DurableJournal(path)
    fill(j)
    assert size(path) == len(MAGIC)
    assert j.dirty
    j.sync()
    assert size(path) > len(MAGIC)
    j._destroy()


def test_set_commit_index_syncs_pending_entries(path):
    j = DurableJournal(path)
    fill(j)
    j.setRaftCommitIndex(2)
    assert j.syncs == 1 and not j.dirty
    assert size(path) == len(MAGIC) + sum(_ENTRY.size + len(c) for c, _, _ in ENTRIES)
    j._destroy()


def test_no_fsync_env_still_writes_entries(path, monkeypatch):
    monkeypatch.setenv(NO_FSYNC_ENV, "1")
    j = DurableJournal(path)
    fill(j)
    j.sync()
    assert not j.dirty
    assert size(path) == len(MAGIC) + sum(_ENTRY.size + len(c) for c, _, _ in ENTRIES)
    j2 = reopen(j)
    assert j2.entries == ENTRIES
    j2._destroy()


def test_clean_cut_below_commit_index_is_corruption(path):
    # No torn bytes at all, but the journal ends before the durable commit index:
    # a disk that lost synced writes.  Cutting nothing would silently lose entry 5.
    j = DurableJournal(path)
    fill(j)
    j.setRaftCommitIndex(5)
    j._destroy()
    cut(path, entry_offsets(ENTRIES)[-1])
    with pytest.raises(CorruptFileError) as ei:
        DurableJournal(path)
    assert path in str(ei.value)


# ------------------------------------------------- committed entries are never cut
def test_cut_below_the_commit_index_keeps_committed_entries(path):
    """pysyncobj cuts after an AppendEntries' prevLogIdx even where entries match; a resent
    AppendEntries with an older prevLogIdx must not remove committed (applied) entries."""
    j = DurableJournal(path)
    fill(j)
    j.setRaftCommitIndex(3)  # entries 1..3 committed, 4..5 not
    j.deleteEntriesFrom(1)  # "cut from index 2"
    assert [e[1] for e in j.entries] == [1, 2, 3]  # only the uncommitted tail went
    assert j.kept_committed == 1
    # The leader's copies follow: the same entries are recognised and skipped ...
    for e in ENTRIES[1:3]:
        j.add(*e)
    # ... and the uncommitted ones appended again.
    j.add(b"new four", 4, 4)
    j.sync()
    assert [(e[1], e[2]) for e in j.entries] == [(1, 1), (2, 1), (3, 2), (4, 4)]
    again = reopen(j)
    assert [e[1] for e in again.entries] == [1, 2, 3, 4]
    assert again.entries[3][0] == b"new four"


def test_cut_above_the_commit_index_is_a_plain_cut(path):
    j = DurableJournal(path)
    fill(j)
    j.setRaftCommitIndex(2)
    j.deleteEntriesFrom(3)
    assert [e[1] for e in j.entries] == [1, 2, 3]
    assert j.kept_committed == 0
    j.add(b"other four", 4, 9)
    assert j.entries[-1] == (b"other four", 4, 9)


@pytest.mark.parametrize("change", ["term", "command"])
def test_a_different_committed_entry_stops_the_node(path, monkeypatch, change):
    exits = []
    monkeypatch.setattr(os, "_exit", lambda code: exits.append(code))
    j = DurableJournal(path)
    fill(j)
    j.setRaftCommitIndex(3)
    j.deleteEntriesFrom(1)
    command, idx, term = ENTRIES[1]
    j.add(*((command, idx, term + 1) if change == "term" else (b"not the same", idx, term)))
    from quorum.journal import EXIT_DIVERGED
    assert exits == [EXIT_DIVERGED]
