"""broker.storage.Storage limits and shared resources on real files in tmp_path, no broker process:
max_topics / max_partitions, one descriptor cache for every partition, retention settings reaching them,
file names for every legal topic name, and a topic creation that fails leaving nothing behind."""
from __future__ import annotations

import errno
import logging
import os

import pytest

import broker.storage as storage_module
from broker.recordbatch import decode_all, encode_batch
from broker.storage import MAX_ENTRY_NAME, Storage, UnknownTopicOrPartitionError, topic_stem
from snapshots.storage.disk import CorruptFileError, StorageFailure
from records.wire.errors import Errors

TS = 1_700_000_000_000


def plain(value: bytes, ts: int = TS) -> bytes:
    return encode_batch([(None, value)], timestamp_ms=ts)


def test_auto_creation_beyond_max_topics_is_refused_with_unknown_topic(tmp_path):
    root = str(tmp_path)
    with Storage(root, max_topics=2) as s:
        s.partition("a", 0)
        s.ensure_topic("b")
        for create in (lambda: s.partition("c", 0), lambda: s.ensure_topic("c")):
            with pytest.raises(UnknownTopicOrPartitionError) as ei:
                create()
            assert ei.value.code == Errors.UNKNOWN_TOPIC_OR_PARTITION
            assert "max_topics" in ei.value.message and "'c'" in ei.value.message
        assert s.topic("c") is None and not os.path.exists(os.path.join(root, "c-0"))
        assert s.refused_creations == 2
        assert s.partition("a", 0).append(plain(b"x")).ok  # existing topics are untouched
    with Storage(root, max_topics=1) as s:  # a lower limit opens what exists, refuses new topics
        assert [t.name for t in s.topics()] == ["a", "b"]
        with pytest.raises(UnknownTopicOrPartitionError):
            s.partition("c", 0)
    with Storage(root, max_topics=3) as s:
        s.partition("c", 0)


def test_partition_count_is_bounded(tmp_path):
    with Storage(str(tmp_path), default_partitions=2, max_partitions=5) as s:
        s.partition("a", 0)
        s.ensure_topic("b", partitions=3)
        with pytest.raises(UnknownTopicOrPartitionError, match="max_partitions"):
            s.partition("c", 0)
        with pytest.raises(UnknownTopicOrPartitionError, match="max_partitions"):
            s.ensure_topic("d", partitions=10**6)
        assert len(s.topics()) == 2


def test_bad_limits_are_refused(tmp_path):
    for kw in ({"max_topics": 0}, {"max_partitions": 0}, {"max_open_segments": 0}):
        with pytest.raises(ValueError):
            Storage(str(tmp_path), **kw)


def test_every_partition_opens_segments_through_one_bounded_cache(tmp_path):
    one = len(plain(b"p0-0"))
    with Storage(str(tmp_path), default_partitions=3, max_open_segments=2, segment_bytes=one) as s:
        parts = [s.partition(t, p) for t in ("a", "b") for p in range(3)]
        for i in range(3):
            for k, part in enumerate(parts):
                assert part.append(plain(f"p{k}-{i}".encode())).ok
        assert s.segment_files.open_count <= 2
        for k, part in enumerate(parts):
            for i in range(3):
                assert f"p{k}-{i}".encode() in part.read(i, 10**6)
                assert s.segment_files.open_count <= 2
        assert s.segment_files.stats["evictions"] > 0
    assert s.segment_files.open_count == 0


def test_retention_ms_reaches_the_partitions(tmp_path):
    now = [TS]
    one = len(plain(b"x"))
    root = str(tmp_path)
    opts = dict(segment_bytes=one, retention_ms=60_000, clock_ms=lambda: now[0])
    with Storage(root, **opts) as s:
        p = s.partition("t", 0)
        for i in range(3):
            assert p.append(plain(b"x", ts=TS + i)).ok
        assert p.log_start_offset == 0
        now[0] = TS + 60_001  # the first segment's record is now more than a minute old; the others not
        assert p.append(plain(b"x", ts=now[0])).ok
        p.wait_snapshots()  # segments go once a snapshot covering them is durable
        assert p.log_start_offset == 1
        now[0] = TS + 10**6
    with Storage(root, **opts) as s:  # checked on open too
        assert s.partition("t", 0).log_start_offset == 3


# ------------------------------------------------------------------ topic names and files
def values(part) -> list[bytes]:
    return [v for _, _, _, v in decode_all(part.read(0, 1 << 20))]


def long_name(n: int, fill: str = "t") -> str:
    return (f"L{n}-" + fill * n)[:n]


@pytest.mark.parametrize("n", [1, 200, 240, 245, 246, 249])
def test_every_legal_name_length_is_created_and_reopened(tmp_path, n, caplog):
    root = str(tmp_path)
    name = long_name(n)
    with Storage(root, default_partitions=3) as s:
        for p in range(3):
            assert s.partition(name, p).append(plain(f"{p}".encode())).ok
        topic_id = s.topic(name).topic_id
    assert all(len(entry.encode()) <= MAX_ENTRY_NAME for entry in os.listdir(root))
    if n <= 245:  # the layout every existing data directory has: found as it is
        assert sorted(os.listdir(root)) == sorted([f"{name}-0", f"{name}-1", f"{name}-2", f"{name}.topic"])
    with caplog.at_level(logging.WARNING, logger="broker.storage"), Storage(root) as s:
        assert [(t.name, t.partitions, t.topic_id) for t in s.topics()] == [(name, 3, topic_id)]
        assert [values(s.partition(name, p)) for p in range(3)] == [[b"0"], [b"1"], [b"2"]]
    assert "belongs to no topic" not in caplog.text


def test_a_long_name_gets_a_short_stem_that_no_legal_name_has():
    a, b = long_name(249, "a"), long_name(249, "a")[:-1] + "b"  # the same first 248 characters
    assert topic_stem(a) == topic_stem(a) != topic_stem(b)
    assert topic_stem(long_name(245)) == long_name(245)
    for name in (a, b, long_name(246)):
        stem = topic_stem(name)
        assert stem.startswith(name[:200]) and "+" in stem  # "+" is outside [a-zA-Z0-9._-]
        assert len(f"{stem}.topic.tmp") <= MAX_ENTRY_NAME and len(f"{stem}-{2**31 - 1}") <= MAX_ENTRY_NAME


def test_metadata_file_under_another_topics_stem_is_refused(tmp_path):
    root = str(tmp_path)
    name = long_name(249)
    with Storage(root) as s:
        s.ensure_topic(name)
    stem = topic_stem(name)
    os.rename(os.path.join(root, stem + ".topic"), os.path.join(root, "other.topic"))
    os.rename(os.path.join(root, stem + "-0"), os.path.join(root, "other-0"))
    with pytest.raises(CorruptFileError, match="holds the metadata of topic"):
        Storage(root)


@pytest.mark.parametrize("n", [5, 249])
def test_a_failed_topic_creation_leaves_nothing_behind(tmp_path, monkeypatch, n, caplog):
    root = str(tmp_path)
    name = long_name(n)
    real = storage_module.atomic_write

    def full_disk(path, data):
        open(path + ".tmp", "wb").close()  # as far as Disk.write_file gets before the disk says no
        raise StorageFailure("fsync", path + ".tmp", OSError(errno.ENOSPC, "No space left on device"))

    with Storage(root, default_partitions=3) as s:
        s.ensure_topic("kept")
        before = sorted(os.listdir(root))
        monkeypatch.setattr(storage_module, "atomic_write", full_disk)
        with pytest.raises(OSError, match="disk full"):
            s.ensure_topic(name)
        with pytest.raises(OSError):
            s.partition(name, 0)
        assert sorted(os.listdir(root)) == before and s.topic(name) is None
        assert "removed what it made" in caplog.text
        monkeypatch.setattr(storage_module, "atomic_write", real)
        assert s.partition(name, 2).append(plain(b"x")).ok  # the disk is back: created as usual
    with Storage(root) as s:
        assert sorted(t.name for t in s.topics()) == sorted(["kept", name])


def test_a_failed_creation_removes_only_the_directories_it_made(tmp_path, monkeypatch):
    """A directory a crashed creation left (no metadata file) is reused, and kept if this one fails too;
    a partition that cannot be opened fails the creation like the metadata file."""
    root = str(tmp_path)
    with Storage(root, default_partitions=3) as s:
        real = s._open_partition

        def third_fails(name, p):
            if p == 2:
                raise OSError(errno.EIO, "Input/output error")
            return real(name, p)

        os.makedirs(os.path.join(root, "t-0"))
        monkeypatch.setattr(s, "_open_partition", third_fails)
        with pytest.raises(OSError, match="Input/output"):
            s.ensure_topic("t")
        assert sorted(os.listdir(root)) == ["t-0"]
        monkeypatch.setattr(s, "_open_partition", real)
        assert s.ensure_topic("t").partitions == 3


def test_a_creation_whose_directory_sync_fails_after_the_rename_leaves_nothing(tmp_path, monkeypatch):
    """The metadata file was renamed into place, then the directory sync failed: the creation is undone with
    the metadata file removed first, so no restart finds a topic whose partition directories are gone."""
    root = str(tmp_path)
    real = storage_module.atomic_write

    def renamed_then_sync_failed(path, data):
        real(path, data)
        raise StorageFailure("fsync", root, OSError(errno.EIO, "Input/output error"))
    with Storage(root) as s:
        monkeypatch.setattr(storage_module, "atomic_write", renamed_then_sync_failed)
        with pytest.raises(OSError):
            s.ensure_topic("t", 2)
        monkeypatch.undo()
        assert s.topic("t") is None
    assert not any(name.startswith("t") for name in os.listdir(root))
    with Storage(root) as s:  # opens: nothing names missing directories
        assert s.topic("t") is None
        assert s.ensure_topic("t", 2).partitions == 2
