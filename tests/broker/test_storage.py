"""broker.storage.Storage limits and shared resources on real files in tmp_path, no broker process:
max_topics / max_partitions, one descriptor cache for every partition, retention settings reaching them."""
from __future__ import annotations

import os

import pytest

from broker.recordbatch import encode_batch
from broker.storage import Storage, UnknownTopicOrPartitionError
from wire.errors import Errors

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
