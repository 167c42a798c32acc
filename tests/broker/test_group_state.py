"""The consumer groups' durable state without processes: ``GroupState`` replay of each kind of entry (offsets,
transactional offsets ended by their shard's marker, generations, deletes), ``rows`` rebuilding the same state,
``shard_of`` agreeing with Kafka's placement of a group in __consumer_offsets, ``check_entry`` refusing what a
writer never writes, and ``GroupStore`` over a real directory: reopen, a torn tail, damage, a rewrite."""
from __future__ import annotations

import asyncio
import os

import pytest

from broker.groups import store as store_mod
from broker.groups.state import (DELETE, GENERATION, MARKER, OFFSET, OFFSETS_SHARDS, TXN_OFFSET, Committed,
                                 GroupState, check_entry, java_string_hash, shard_of)
from broker.groups.store import FILE_NAME, MAGIC, GroupStore
from snapshots.storage.disk import CorruptFileError

MEMBER = ["m-1", None, "client-a", "/127.0.0.1", 10_000, 30_000, b"\x00\x01meta", b"\x00\x02assign"]
STATIC = ["m-2", "instance-2", "client-b", "/127.0.0.1", 45_000, 60_000, b"", b"a2"]


def replay(entries: list[list]) -> GroupState:
    s = GroupState()
    for e in entries:
        check_entry(e)
        s.apply(e)
    return s


def view(s: GroupState) -> tuple:
    """Everything a state holds, comparable with ==."""
    pending = {g: {pid: (p.producer_epoch, p.offsets) for pid, p in by.items()} for g, by in s.pending.items()}
    return (s.offsets, pending,
            s.pending_groups, s.generations)


def other_shard_group(group: str) -> str:
    """A group whose offsets shard is not ``group``'s."""
    return next(f"other-{i}" for i in range(1000) if shard_of(f"other-{i}") != shard_of(group))


def same_shard_group(group: str) -> str:
    """Another group in ``group``'s offsets shard."""
    return next(f"same-{i}" for i in range(10_000) if shard_of(f"same-{i}") == shard_of(group))


# ------------------------------------------------------------ shard_of: Kafka's partitionFor(groupId)
def java_hash_by_hand(s: str) -> int:
    """String.hashCode as Java defines it: s[0]*31^(n-1) + ... + s[n-1] over UTF-16 code units, in int."""
    units = []
    for ch in s:
        cp = ord(ch)
        if cp >= 0x10000:  # a surrogate pair: two code units
            cp -= 0x10000
            units += [0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF)]
        else:
            units.append(cp)
    n = len(units)
    total = sum(u * 31 ** (n - 1 - i) for i, u in enumerate(units)) % 2 ** 32
    return total - 2 ** 32 if total >= 2 ** 31 else total


def kafka_utils_abs(n: int) -> int:
    """org.apache.kafka.common.utils.Utils.abs: ``(n == Integer.MIN_VALUE) ? 0 : Math.abs(n)`` (not a mask:
    a negative hash keeps its magnitude), what GroupMetadataManager.partitionFor applies to groupId.hashCode."""
    return 0 if n == -2 ** 31 else abs(n)


def test_java_hash_of_known_strings():
    # values any JVM prints for "...".hashCode()
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("Aa") == java_string_hash("BB") == 2112
    assert java_string_hash("polygenelubricants") == -2147483648  # Integer.MIN_VALUE


@pytest.mark.parametrize("group", ["my-group", "Gruppe-Größe-ü", "群组-消费者", "emoji-\U0001F600-group", "a" * 300,
                                   "hello", "gruppe-ü", "消费者", "\U0001F600", "polygenelubricants"])
def test_java_string_hash_is_javas_over_utf16_code_units(group):
    assert java_string_hash(group) == java_hash_by_hand(group)


@pytest.mark.parametrize("group", ["hello", "console-consumer-12345", "test-group", "gruppe-ü", "消费者", "\U0001F600",
                                   "polygenelubricants"])
def test_shard_of_is_kafkas_partition_for_a_group_with_a_positive_hash(group):
    h = java_hash_by_hand(group)
    assert h >= 0 or h == -2 ** 31
    assert shard_of(group) == kafka_utils_abs(h) % 50
    assert 0 <= shard_of(group) < OFFSETS_SHARDS == 50


@pytest.mark.parametrize("group", ["my-group", "Gruppe-Größe-ü", "群组-消费者", "emoji-\U0001F600-group", "a" * 300,
                                   "orders-consumer"])
def test_shard_of_is_kafkas_partition_for_a_group_with_a_negative_hash(group):
    h = java_hash_by_hand(group)
    assert h < 0
    assert shard_of(group) == kafka_utils_abs(h) % 50


def test_shard_of_my_group_by_hand():
    # "my-group": the 31-polynomial of its ASCII codes in 32-bit two's complement is -1906497762;
    # Kafka: Utils.abs(-1906497762) % 50 = 1906497762 % 50 = 12 (a mask, h & 0x7fffffff, would give 36)
    h = 0
    for c in b"my-group":
        h = (h * 31 + c) & 0xFFFFFFFF
    assert h - 2 ** 32 == -1906497762
    assert shard_of("my-group") == 1906497762 % 50 == 12


def test_shard_of_integer_min_value_is_zero():
    assert shard_of("polygenelubricants") == 0  # Utils.abs(Integer.MIN_VALUE) is 0, Math.abs would stay negative


# ------------------------------------------------------------ replay
def test_offset_commits_replace_per_partition():
    s = replay([[OFFSET, "g", "t", 0, 5, 1, "m0", 100], [OFFSET, "g", "t", 1, 7, -1, None, 101],
                [OFFSET, "g", "t", 0, 9, 2, "m1", 102], [OFFSET, "h", "t", 0, 3, 0, "", 103]])
    assert s.offsets == {"g": {("t", 0): Committed(9, 2, "m1", 102), ("t", 1): Committed(7, -1, None, 101)},
                         "h": {("t", 0): Committed(3, 0, "", 103)}}
    assert s.groups() == {"g", "h"}
    assert s.size() == 3


def txn(group, pid, epoch, topic, partition, offset, metadata="tx"):
    return [TXN_OFFSET, group, pid, epoch, topic, partition, offset, -1, metadata, 500]


def test_txn_offsets_are_pending_until_their_shards_commit_marker():
    g = "my-group"
    s = replay([[OFFSET, g, "t", 0, 1, -1, None, 1], txn(g, 7, 3, "t", 0, 10), txn(g, 7, 3, "t", 1, 11)])
    assert s.offsets[g] == {("t", 0): Committed(1, -1, None, 1)}  # not yet
    assert set(s.pending[g][7].offsets) == {("t", 0), ("t", 1)}
    assert s.pending_groups == {7: {g}}
    assert s.pending_in_shard(shard_of(g), 7) and not s.pending_in_shard((shard_of(g) + 1) % 50, 7)
    s.apply([MARKER, shard_of(g), 7, 3, True])
    assert s.offsets[g] == {("t", 0): Committed(10, -1, "tx", 500), ("t", 1): Committed(11, -1, "tx", 500)}
    assert s.pending == {} and s.pending_groups == {}


def test_an_abort_marker_drops_the_pending_offsets_and_keeps_the_committed_ones():
    g = "my-group"
    s = replay([[OFFSET, g, "t", 0, 1, -1, None, 1], txn(g, 7, 3, "t", 0, 10), txn(g, 7, 3, "t", 2, 12)])
    s.apply([MARKER, shard_of(g), 7, 3, False])
    assert s.offsets == {g: {("t", 0): Committed(1, -1, None, 1)}}
    assert s.pending == {} and s.pending_groups == {}


def test_a_marker_of_another_shard_or_producer_or_an_older_epoch_changes_nothing():
    g = "my-group"
    entries = [txn(g, 7, 3, "t", 0, 10)]
    before = view(replay(entries))
    for marker in ([MARKER, (shard_of(g) + 1) % 50, 7, 3, True],  # another shard
                   [MARKER, shard_of(g), 8, 3, True],  # another producer
                   [MARKER, shard_of(g), 7, 2, True],  # an older epoch: the pending offsets are a later txn's
                   [MARKER, shard_of(g), 7, 2, False]):
        s = replay(entries + [marker])
        assert view(s) == before, marker
        assert g not in s.offsets


def test_a_marker_ends_only_the_groups_of_its_shard():
    g, other, same = "my-group", other_shard_group("my-group"), same_shard_group("my-group")
    s = replay([txn(g, 7, 1, "t", 0, 10), txn(other, 7, 1, "t", 0, 20), txn(same, 7, 1, "u", 3, 30)])
    s.apply([MARKER, shard_of(g), 7, 1, True])
    assert s.offsets[g][("t", 0)].offset == 10 and s.offsets[same][("u", 3)].offset == 30
    assert other not in s.offsets and set(s.pending) == {other} and s.pending_groups == {7: {other}}
    s.apply([MARKER, shard_of(other), 7, 1, False])
    assert other not in s.offsets and s.pending == {} and s.pending_groups == {}


def test_a_newer_epochs_txn_offsets_replace_the_older_pending_ones():
    g = "my-group"
    s = replay([txn(g, 7, 1, "t", 0, 10), txn(g, 7, 1, "t", 1, 11), txn(g, 7, 2, "t", 0, 20)])
    assert s.pending[g][7].producer_epoch == 2 and set(s.pending[g][7].offsets) == {("t", 0)}
    s.apply([MARKER, shard_of(g), 7, 2, True])
    assert s.offsets[g] == {("t", 0): Committed(20, -1, "tx", 500)}


def test_two_producers_pending_in_one_group_end_separately():
    g = "my-group"
    s = replay([txn(g, 7, 0, "t", 0, 10), txn(g, 9, 0, "t", 1, 90)])
    s.apply([MARKER, shard_of(g), 9, 0, True])
    assert s.offsets[g] == {("t", 1): Committed(90, -1, "tx", 500)} and set(s.pending[g]) == {7}
    s.apply([MARKER, shard_of(g), 7, 0, True])
    assert set(s.offsets[g]) == {("t", 0), ("t", 1)} and s.pending == {}


def test_generation_entries_keep_the_last_and_delete_forgets_the_group():
    s = replay([[GENERATION, "g", 1, "consumer", "range", "m-1", [MEMBER]],
                [GENERATION, "g", 2, "consumer", "roundrobin", "m-2", [MEMBER, STATIC]],
                [OFFSET, "g", "t", 0, 5, -1, None, 1], [GENERATION, "h", 4, None, None, None, []]])
    gen = s.generations["g"]
    assert (gen.generation, gen.protocol_type, gen.protocol, gen.leader) == (2, "consumer", "roundrobin", "m-2")
    assert [m.row() for m in gen.members] == [MEMBER, STATIC]
    assert s.generations["h"].members == [] and s.groups() == {"g", "h"}
    s.apply([DELETE, "g"])
    assert "g" not in s.offsets and "g" not in s.generations and s.groups() == {"h"}
    s.apply([DELETE, "never-existed"])
    assert s.groups() == {"h"}


def test_rows_rebuild_the_same_state():
    g, other = "my-group", other_shard_group("my-group")
    s = replay([[GENERATION, g, 3, "consumer", "range", "m-1", [MEMBER, STATIC]],
                [OFFSET, g, "t", 0, 5, 1, "meta", 10], [OFFSET, g, "t", 0, 6, 1, None, 11],
                [OFFSET, other, "u", 4, 40, -1, "", 12], txn(g, 7, 2, "t", 1, 100), txn(other, 7, 2, "u", 5, 50),
                txn(g, 8, 0, "t", 2, 200), [MARKER, shard_of(g), 8, 0, True], [OFFSET, "gone", "t", 0, 1, -1, None, 1],
                [DELETE, "gone"]])
    rows = s.rows()
    assert len(rows) == s.size()
    again = replay(rows)
    assert view(again) == view(s)
    # and the pending offsets still end the same way after the rebuild
    for state in (s, again):
        state.apply([MARKER, shard_of(g), 7, 2, True])
    assert view(again) == view(s) and again.offsets[g][("t", 1)].offset == 100


# ------------------------------------------------------------ check_entry
GOOD = [[OFFSET, "g", "t", 0, 5, -1, None, 1], [OFFSET, "g", "t", 0, 5, -1, "m", 1], txn("g", 7, 0, "t", 0, 1),
        txn("g", 7, 0, "t", 0, 1, None), [MARKER, 3, 7, 0, True],
        [GENERATION, "g", 1, "consumer", "range", "m", [MEMBER]],
        [GENERATION, "g", 1, None, None, None, []], [DELETE, "g"]]


@pytest.mark.parametrize("entry", GOOD, ids=lambda e: str(e[0]))
def test_check_entry_accepts_what_the_broker_writes(entry):
    check_entry(entry)


BAD = {
    "not-a-list": ("o", "g"), "empty": [], "unknown-kind": ["x", "g"], "none": None,
    "offset-short": [OFFSET, "g", "t", 0, 5, -1, None], "offset-long": [OFFSET, "g", "t", 0, 5, -1, None, 1, 2],
    "offset-group-int": [OFFSET, 1, "t", 0, 5, -1, None, 1],
    "offset-partition-str": [OFFSET, "g", "t", "0", 5, -1, None, 1],
    "offset-bool": [OFFSET, "g", "t", True, 5, -1, None, 1],
    "offset-metadata-bytes": [OFFSET, "g", "t", 0, 5, -1, b"m", 1],
    "offset-float": [OFFSET, "g", "t", 0, 5.0, -1, None, 1],
    "txn-short": txn("g", 7, 0, "t", 0, 1)[:-1], "txn-pid-str": [TXN_OFFSET, "g", "7", 0, "t", 0, 1, -1, None, 1],
    "txn-topic-int": [TXN_OFFSET, "g", 7, 0, 5, 0, 1, -1, None, 1],
    "marker-commit-int": [MARKER, 3, 7, 0, 1], "marker-shard-str": [MARKER, "3", 7, 0, True],
    "marker-short": [MARKER, 3, 7, True],
    "gen-members-not-list": [GENERATION, "g", 1, "consumer", "range", "m", "members"],
    "gen-member-short": [GENERATION, "g", 1, "consumer", "range", "m", [MEMBER[:7]]],
    "gen-member-metadata-str": [GENERATION, "g", 1, "consumer", "range", "m", [MEMBER[:6] + ["meta", b""]]],
    "gen-member-session-str": [GENERATION, "g", 1, "consumer", "range", "m", [MEMBER[:4] + ["10", 1, b"", b""]]],
    "gen-generation-str": [GENERATION, "g", "1", "consumer", "range", "m", []],
    "gen-protocol-int": [GENERATION, "g", 1, "consumer", 5, "m", []],
    "delete-int": [DELETE, 5], "delete-long": [DELETE, "g", "h"],
}


@pytest.mark.parametrize("entry", list(BAD.values()), ids=list(BAD))
def test_check_entry_refuses_malformed_entries(entry):
    with pytest.raises(ValueError, match="bad entry"):
        check_entry(entry)


# ------------------------------------------------------------ GroupStore on a real directory
ENTRIES = [[GENERATION, "my-group", 2, "consumer", "range", "m-1", [MEMBER, STATIC]],
           [OFFSET, "my-group", "t", 0, 5, 1, "meta", 10], [OFFSET, "my-group", "t", 1, 8, 1, None, 11],
           txn("my-group", 7, 1, "t", 2, 30), txn("other", 9, 0, "t", 0, 3)]


def write_all(data_dir: str, batches: list[list[list]], **kw) -> GroupStore:
    """Open a store, write ``batches`` (each acknowledged before the next), close it."""
    async def go():
        st = GroupStore(data_dir, **kw)
        st.open()
        st.start()
        for b in batches:
            await st.write(b)
        await st.close()
        return st
    return asyncio.run(go())


def reopened(data_dir: str) -> GroupStore:
    st = GroupStore(data_dir)
    st.open()
    st._frames.close()
    return st


def test_store_write_close_reopen_gives_the_same_state(tmp_path):
    d = str(tmp_path)
    st = write_all(d, [ENTRIES[:2], ENTRIES[2:], [[MARKER, shard_of("my-group"), 7, 1, True]]])
    assert st.state.offsets["my-group"][("t", 2)].offset == 30  # applied once acknowledged
    assert st.counters["group_entries_written"] == 6 and st.counters["group_syncs"] >= 1
    again = reopened(d)
    assert view(again.state) == view(st.state)
    assert again.state.offsets["my-group"][("t", 2)].offset == 30 and set(again.state.pending) == {"other"}


def test_group_commit_acknowledges_each_write_after_its_entries_are_applied(tmp_path):
    async def go():
        st = GroupStore(str(tmp_path))
        st.open()
        st.start()
        futs = [st.write([[OFFSET, "g", "t", i, i * 10, -1, None, 1]]) for i in range(20)]
        assert list(st.queued())[:1] == [[OFFSET, "g", "t", 0, 0, -1, None, 1]]
        for i, f in enumerate(futs):
            await f
            assert st.state.offsets["g"][("t", i)].offset == i * 10
        syncs = st.counters["group_syncs"]
        await st.close()
        late = st.write([[DELETE, "g"]])
        with pytest.raises(ConnectionError):
            await late
        return syncs
    syncs = asyncio.run(go())
    assert 1 <= syncs < 20  # several writes shared an fsync
    assert len(reopened(str(tmp_path)).state.offsets["g"]) == 20


def test_a_torn_last_frame_is_cut_at_open(tmp_path):
    d = str(tmp_path)
    write_all(d, [ENTRIES[:2], ENTRIES[2:3]])
    path = os.path.join(d, FILE_NAME)
    whole = os.path.getsize(path)
    write_all(d, [ENTRIES[3:]])
    full = open(path, "rb").read()
    with open(path, "r+b") as f:
        f.truncate(len(full) - 5)  # the last append cut by a crash
    st = reopened(d)
    assert os.path.getsize(path) == whole  # cut back to the last whole frame
    assert set(st.state.offsets["my-group"]) == {("t", 0), ("t", 1)} and st.state.pending == {}
    # appends go on after the cut: the file reads back whole
    write_all(d, [[[OFFSET, "my-group", "t", 3, 33, -1, None, 1]]])
    assert reopened(d).state.offsets["my-group"][("t", 3)].offset == 33


def test_a_missing_or_magic_only_file_is_empty(tmp_path):
    d = str(tmp_path)
    st = reopened(d)
    assert st.state.groups() == set()
    assert open(os.path.join(d, FILE_NAME), "rb").read() == MAGIC
    with open(os.path.join(d, FILE_NAME), "wb") as f:
        f.write(MAGIC[:3])  # the creation cut by a crash
    assert reopened(d).state.groups() == set()
    assert open(os.path.join(d, FILE_NAME), "rb").read() == MAGIC


def test_garbage_in_the_middle_raises_corrupt_file_error(tmp_path):
    d = str(tmp_path)
    write_all(d, [ENTRIES[:2], ENTRIES[2:3], ENTRIES[3:]])
    path = os.path.join(d, FILE_NAME)
    data = bytearray(open(path, "rb").read())
    data[len(MAGIC) + 12] ^= 0xFF  # inside the first frame's body, whole frames after it
    open(path, "wb").write(bytes(data))
    with pytest.raises(CorruptFileError, match="checksum mismatch"):
        GroupStore(d).open()
    open(path, "wb").write(b"NOTGROUPS" + bytes(data[len(MAGIC):]))
    with pytest.raises(CorruptFileError, match="bad magic"):
        GroupStore(d).open()


def test_a_well_checksummed_malformed_entry_raises_corrupt_file_error(tmp_path):
    from broker.framelog import encode_frames
    d = str(tmp_path)
    with open(os.path.join(d, FILE_NAME), "wb") as f:
        f.write(MAGIC + encode_frames([ENTRIES[1]]) + encode_frames([[OFFSET, "g", "t", "zero", 1, -1, None, 1]]))
    with pytest.raises(CorruptFileError, match="undecodable"):
        GroupStore(d).open()


def test_a_rewrite_keeps_the_state_and_shrinks_the_file(tmp_path, monkeypatch):
    d = str(tmp_path)
    monkeypatch.setattr(store_mod, "REWRITE_SLACK", 5)
    batches = [[[OFFSET, "my-group", "t", n % 3, n, -1, None, n]] for n in range(40)]
    batches += [ENTRIES, [[MARKER, shard_of("my-group"), 7, 1, False]], [[DELETE, "other"]]]
    st = write_all(d, batches)
    assert st.counters["group_rewrites"] >= 1
    again = reopened(d)
    assert view(again.state) == view(st.state)
    assert again._frames.entries <= 2 * again.state.size() + 5
    assert again.state.offsets["my-group"][("t", 0)].offset == 5  # ENTRIES' commit came after the 40
    assert set(again.state.pending) == {"other"}  # a delete leaves a transaction's pending offsets to its marker
