"""broker.storage's topic administration on real files in tmp_path, no broker process: CreateTopics' checks,
per-topic configs reaching the partitions and surviving a restart (and format 1 metadata files still read),
CreatePartitions, DeleteTopics and what a restart sees after a crash at each step of a deletion or a growth,
reserved internal topic names."""
from __future__ import annotations

import logging
import os
import uuid

import pytest

import broker.storage as storage_module
from broker.recordbatch import encode_batch
from broker.storage import (DELETED_SUFFIX, DELETING_PREFIX, INVALID_CONFIG, INVALID_PARTITIONS, POLICY_VIOLATION,
                            TOPIC_ALREADY_EXISTS, TOPIC_MAGIC, UNKNOWN_TOPIC_ID, InvalidTopicError, Storage,
                            TopicAdminError, TopicInfo, UnknownTopicOrPartitionError, _encode_topic,
                            parse_topic_configs)
from snapshots.storage.disk import CorruptFileError
from snapshots.storage.files import seal

TS = 1_700_000_000_000


def plain(value: bytes, ts: int = TS) -> bytes:
    return encode_batch([(None, value)], timestamp_ms=ts)


def entries(root: str) -> set[str]:
    return set(os.listdir(root))


def test_create_topic_with_configs_reaches_its_partitions_and_survives_a_restart(tmp_path):
    root = str(tmp_path)
    with Storage(root, retention_ms=7 * 86400_000, segment_bytes=1 << 20) as s:
        info = s.create_topic("t", 3, {"retention.ms": "60000", "segment.bytes": "4096",
                                       "max.message.bytes": "2048"})
        assert info.partitions == 3 and info.config == {"max.message.bytes": "2048", "retention.ms": "60000",
                                                        "segment.bytes": "4096"}
        p = s.partition("t", 2)
        assert (p.retention_ms, p.log.segment_bytes, p.max_batch_bytes) == (60000, 4096, 2048)
        other = s.partition("u", 0)  # auto-created: the broker's settings
        assert (other.retention_ms, other.log.segment_bytes) == (7 * 86400_000, 1 << 20)
        assert not p.append(encode_batch([(None, b"x" * 4000)])).ok  # over this topic's max.message.bytes
        assert p.append(plain(b"small")).ok
    with Storage(root, retention_ms=7 * 86400_000, segment_bytes=1 << 20) as s:
        assert s.topic("t").config["retention.ms"] == "60000"
        p = s.partition("t", 2)
        assert (p.retention_ms, p.log.segment_bytes, p.high_watermark) == (60000, 4096, 1)
        assert s.default_config("retention.ms") == str(7 * 86400_000)
        assert s.default_config("retention.bytes") == "-1"


def test_a_format_1_metadata_file_is_still_read(tmp_path):
    root = str(tmp_path)
    with Storage(root) as s:
        s.ensure_topic("old", 2)
    tid = uuid.uuid4()
    with open(os.path.join(root, "old.topic"), "wb") as f:  # what the broker wrote before topic configs
        f.write(seal(TOPIC_MAGIC, {"format": 1, "name": "old", "topic_id": tid.bytes, "partitions": 2}))
    with Storage(root) as s:
        assert s.topic("old") == TopicInfo("old", tid, 2, ())


def test_create_topic_refusals(tmp_path):
    with Storage(str(tmp_path), default_partitions=2, max_topics=3) as s:
        assert s.create_topic("a", -1, {}).partitions == 2  # -1: the broker's default
        for n in (0, -2, 10_001, 2**31 - 1):
            with pytest.raises(TopicAdminError) as ei:
                s.create_topic("b", n, {})
            assert ei.value.code == INVALID_PARTITIONS
        with pytest.raises(TopicAdminError) as ei:
            s.create_topic("a", 1, {})
        assert ei.value.code == TOPIC_ALREADY_EXISTS
        s.create_topic("x.y", 1, {})
        with pytest.raises(InvalidTopicError, match="collides"):
            s.create_topic("x_y", 1, {})
        for bad in ("", "a/b", "." * 1, "x" * 250, None):
            with pytest.raises(InvalidTopicError):
                s.create_topic(bad, 1, {})
        assert s.create_topic("v", 1, {}, validate_only=True).topic_id == uuid.UUID(int=0)
        assert s.topic("v") is None and not os.path.exists(os.path.join(str(tmp_path), "v-0"))
        s.create_topic("c", 1, {})
        with pytest.raises(TopicAdminError) as ei:  # max_topics: Kafka's answer to a refused creation
            s.create_topic("d", 1, {})
        assert ei.value.code == POLICY_VIOLATION and "max_topics" in ei.value.message
        with pytest.raises(UnknownTopicOrPartitionError):  # auto-creation keeps its answer
            s.partition("d", 0)


@pytest.mark.parametrize("pairs, why", [
    ([("retention.ms", "abc")], "not an integer"), ([("retention.ms", "-5")], "out of range"),
    ([("retention.ms", None)], "null"), ([("segment.bytes", str(2**31))], "out of range"),
    ([("segment.bytes", "100")], "out of range"), ([("no.such.config", "1")], "unknown topic config"),
    ([("cleanup.policy", "compact")], "compaction is not served"),
    ([("cleanup.policy", "delete,compact")], "compaction is not served"), ([("cleanup.policy", "x")], "only"),
    ([("retention.ms", "1"), ("retention.ms", "2")], "more than once"), ([("retention.bytes", "9" * 30)], "integer"),
])
def test_bad_topic_configs_are_invalid_config(pairs, why):
    with pytest.raises(TopicAdminError, match=why) as ei:
        parse_topic_configs(pairs)
    assert ei.value.code == INVALID_CONFIG


def test_good_topic_configs_are_normalized():
    assert parse_topic_configs([("retention.ms", " -1 "), ("cleanup.policy", "delete"),
                                ("retention.bytes", "+100")]) == {
        "retention.ms": "-1", "cleanup.policy": "delete", "retention.bytes": "100"}


def test_reserved_names_are_refused_but_an_existing_one_opens(tmp_path, caplog):
    root = str(tmp_path)
    with Storage(root) as s:
        for create in (lambda: s.partition("__consumer_offsets", 0), lambda: s.ensure_topic("__transaction_state"),
                       lambda: s.create_topic("__consumer_offsets", 1, {})):
            with pytest.raises(InvalidTopicError, match="internal"):
                create()
        assert s.topics() == []
    os.makedirs(os.path.join(root, "__consumer_offsets-0"))
    with open(os.path.join(root, "__consumer_offsets.topic"), "wb") as f:
        f.write(_encode_topic(TopicInfo("__consumer_offsets", uuid.uuid4(), 1)))
    with caplog.at_level(logging.WARNING, logger="broker.storage"), Storage(root) as s:
        assert s.partition("__consumer_offsets", 0).append(plain(b"x")).ok
    assert "reserved" in caplog.text


def test_delete_then_create_again_gives_a_new_empty_topic(tmp_path):
    root = str(tmp_path)
    with Storage(root) as s:
        first = s.create_topic("t", 2, {"retention.ms": "1000"})
        part = s.partition("t", 1)
        assert part.append(plain(b"x")).ok
        assert s.delete_topic("t") == first
        assert entries(root) == set()
        with pytest.raises(ValueError):  # an append racing the deletion finds the partition closed
            part.append(plain(b"y"))
        with pytest.raises(UnknownTopicOrPartitionError):
            s.delete_topic("t")
        with pytest.raises(TopicAdminError) as ei:
            s.delete_topic(None, uuid.uuid4())
        assert ei.value.code == UNKNOWN_TOPIC_ID
        second = s.create_topic("t", 1, {})
        assert second.topic_id != first.topic_id and second.config == {}
        assert s.partition("t", 0).high_watermark == 0
        assert s.delete_topic(None, second.topic_id).name == "t"
    with Storage(root) as s:
        assert s.topics() == []


def _deleting(root: str, s: Storage, name: str, renamed: int) -> None:
    """The disk as a deletion of ``name`` cut by a crash leaves it: the metadata file renamed, the first
    ``renamed`` partition directories renamed too."""
    info = s.topic(name)
    s.close()
    os.rename(os.path.join(root, f"{name}.topic"), os.path.join(root, f"{name}{DELETED_SUFFIX}"))
    for p in range(renamed):
        os.rename(os.path.join(root, f"{name}-{p}"),
                  os.path.join(root, f"{DELETING_PREFIX}{info.topic_id.hex}-{p}"))


@pytest.mark.parametrize("renamed", [0, 1, 3])
def test_a_deletion_cut_by_a_crash_is_finished_at_restart(tmp_path, renamed, caplog):
    root = str(tmp_path)
    s = Storage(root)
    s.create_topic("t", 3, {})
    s.create_topic("keep", 1, {})
    assert s.partition("t", 0).append(plain(b"x")).ok
    _deleting(root, s, "t", renamed)
    with caplog.at_level(logging.WARNING, logger="broker.storage"), Storage(root) as s2:
        assert [t.name for t in s2.topics()] == ["keep"]
        assert entries(root) == {"keep.topic", "keep-0"}
        assert "belongs to no topic" not in caplog.text
        assert s2.create_topic("t", 1, {}) and s2.partition("t", 0).high_watermark == 0


def test_a_deletion_cut_after_the_metadata_file_is_gone_leaves_only_harmless_directories(tmp_path):
    root = str(tmp_path)
    s = Storage(root)
    info = s.create_topic("t", 2, {})
    assert s.partition("t", 1).append(plain(b"x")).ok
    _deleting(root, s, "t", 2)
    os.unlink(os.path.join(root, f"t{DELETED_SUFFIX}"))  # the step before the directories' removal
    with Storage(root) as s2:
        assert s2.topics() == [] and entries(root) == set()
        assert s2.create_topic("t", 2, {}).topic_id != info.topic_id
        assert s2.partition("t", 1).high_watermark == 0


def test_the_deletion_s_first_step_is_the_metadata_rename(tmp_path, monkeypatch):
    """A failure at the first rename leaves the topic whole (served, and opened at restart)."""
    root = str(tmp_path)
    with Storage(root) as s:
        s.create_topic("t", 1, {})

        def refuse(src, dst):
            raise OSError(5, "Input/output error")
        monkeypatch.setattr(os, "rename", refuse)
        with pytest.raises(OSError):
            s.delete_topic("t")
        monkeypatch.undo()
        assert s.partition("t", 0).append(plain(b"x")).ok
    with Storage(root) as s:
        assert s.partition("t", 0).high_watermark == 1


def test_create_partitions_grows_durably_and_a_cut_growth_is_harmless(tmp_path):
    root = str(tmp_path)
    with Storage(root, max_partitions=6) as s:
        s.create_topic("t", 2, {"retention.ms": "5000"})
        with pytest.raises(TopicAdminError) as ei:
            s.create_partitions("t", 2)
        assert ei.value.code == INVALID_PARTITIONS
        with pytest.raises(TopicAdminError) as ei:
            s.create_partitions("t", 7)
        assert ei.value.code == POLICY_VIOLATION
        assert s.create_partitions("t", 4, validate_only=True).partitions == 4 and s.topic("t").partitions == 2
        assert s.create_partitions("t", 4).partitions == 4
        assert s.partition("t", 3).retention_ms == 5000
        with pytest.raises(UnknownTopicOrPartitionError):
            s.create_partitions("nope", 4)
    with Storage(root) as s:
        assert s.topic("t").partitions == 4 and s.partition("t", 3).append(plain(b"x")).ok
    os.makedirs(os.path.join(root, "t-4"))  # a growth cut before its metadata file: a directory of no topic
    with Storage(root) as s:
        assert s.topic("t").partitions == 4
        assert s.create_partitions("t", 5).partitions == 5
    # the metadata file written but a directory missing (not this code's order): refused loudly
    os.rename(os.path.join(root, "t-4"), os.path.join(root, "elsewhere"))
    with pytest.raises(CorruptFileError, match="missing"):
        Storage(root)


def test_alter_topic_configs_is_durable_and_reaches_the_partitions(tmp_path):
    root = str(tmp_path)
    with Storage(root, retention_ms=1000) as s:
        s.create_topic("t", 1, {"retention.ms": "5"})
        s.alter_topic_configs("t", {"segment.bytes": "2048"})
        p = s.partition("t", 0)
        assert (p.retention_ms, p.log.segment_bytes) == (1000, 2048)
    with Storage(root, retention_ms=1000) as s:
        assert s.topic("t").config == {"segment.bytes": "2048"}


def test_a_deletion_an_error_cut_is_finished_before_the_name_is_created_again(tmp_path, monkeypatch):
    """The metadata file renamed, then the disk refuses a directory's rename: the topic is gone, and creating it
    again first finishes the old deletion, so neither the old data nor the old tombstone survive."""
    root = str(tmp_path)
    with Storage(root) as s:
        old = s.create_topic("t", 2, {})
        assert s.partition("t", 1).append(plain(b"old")).ok
        real = os.rename

        def refuse_directories(src, dst):
            if os.path.basename(src).startswith("t-"):
                raise OSError(5, "Input/output error")
            real(src, dst)
        monkeypatch.setattr(os, "rename", refuse_directories)
        with pytest.raises(OSError):
            s.delete_topic("t")
        monkeypatch.undo()
        assert s.topic("t") is None and f"t{DELETED_SUFFIX}" in entries(root)
        new = s.create_topic("t", 2, {})
        assert new.topic_id != old.topic_id and s.partition("t", 1).high_watermark == 0
        assert f"t{DELETED_SUFFIX}" not in entries(root)
        assert s.partition("t", 1).append(plain(b"new")).ok
    with Storage(root) as s:  # the restart keeps the new topic and its record
        assert s.topic("t").topic_id == new.topic_id and s.partition("t", 1).high_watermark == 1


def test_a_growth_whose_metadata_write_fails_leaves_the_topic_as_it_was(tmp_path, monkeypatch):
    root = str(tmp_path)
    with Storage(root) as s:
        s.create_topic("t", 1, {})

        def refuse(path, data):
            raise OSError(28, "No space left on device")
        monkeypatch.setattr(storage_module, "atomic_write", refuse)
        with pytest.raises(OSError):
            s.create_partitions("t", 3)
        monkeypatch.undo()
        assert s.topic("t").partitions == 1
        with pytest.raises(UnknownTopicOrPartitionError):
            s.partition("t", 1)
    with Storage(root) as s:  # the new, empty directories are of no topic; the next growth reuses them
        assert s.topic("t").partitions == 1
        assert s.create_partitions("t", 3).partitions == 3 and s.partition("t", 2).append(plain(b"x")).ok
