"""All partitions of a broker under one data directory, with topics created on first use (bounded by
``max_topics`` / ``max_partitions``).  Layout, long topic names, crash-safe creation and the limits' error
code: docs/brokers.md, "A broker's data directory".  Thread-safe: the storage lock, then each partition's own.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import threading
import uuid
from dataclasses import dataclass
from typing import Any

from snapshots.storage.disk import CorruptFileError
from snapshots.storage.files import atomic_write, fsync_dir, seal, unseal
from records.wire.errors import Errors, for_code

from .partition import Partition
from .segment_files import SegmentFiles

log = logging.getLogger(__name__)

TOPIC_SUFFIX = ".topic"
TOPIC_MAGIC = b"PQTOPC\x00\x01"
TOPIC_FORMAT = 1
MAX_TOPIC_NAME = 249
MAX_ENTRY_NAME = 255  # bytes of one directory entry (ext4, xfs, btrfs, tmpfs)
TMP_SUFFIX = ".tmp"  # snapshots.storage.disk.Disk.write_file writes <path>.tmp, then renames it
SHORT_STEM_PREFIX = 200  # characters of a long name kept in its stem, before "+<hash>"
_LEGAL = re.compile(r"^[a-zA-Z0-9._-]+$")
_PARTITION_DIR = re.compile(r"^(.+)-(\d+)$")
DEFAULT_MAX_OPEN_SEGMENTS = 1000

# The classes errors.py registers for these codes (one class per code).
InvalidTopicError = type(for_code(Errors.INVALID_TOPIC_EXCEPTION))
UnknownTopicOrPartitionError = type(for_code(Errors.UNKNOWN_TOPIC_OR_PARTITION))


def validate_topic_name(name: Any) -> None:
    """Raise ``InvalidTopicError`` unless ``name`` is a legal Kafka topic name."""
    if not isinstance(name, str) or not name:
        raise InvalidTopicError(f"topic name must be a non-empty string, got {name!r}")
    if name in (".", ".."):
        raise InvalidTopicError(f"topic name cannot be {name!r}")
    if len(name) > MAX_TOPIC_NAME:
        raise InvalidTopicError(f"topic name is {len(name)} characters long, the limit is {MAX_TOPIC_NAME}")
    if not _LEGAL.match(name):
        raise InvalidTopicError(f"topic name {name!r} has characters outside [a-zA-Z0-9._-]")


def topic_stem(name: str) -> str:
    """The stem of a (legal) topic's file names: the name itself if ``<name>.topic.tmp`` fits in a
    directory entry, else its first 200 characters, "+" and 32 hex digits of its SHA-256."""
    if len(name) + len(TOPIC_SUFFIX) + len(TMP_SUFFIX) <= MAX_ENTRY_NAME:  # legal names are ASCII
        return name
    return f"{name[:SHORT_STEM_PREFIX]}+{hashlib.sha256(name.encode()).hexdigest()[:32]}"


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    topic_id: uuid.UUID
    partitions: int


def _encode_topic(info: TopicInfo) -> bytes:
    return seal(TOPIC_MAGIC, {"format": TOPIC_FORMAT, "name": info.name, "topic_id": info.topic_id.bytes,
                              "partitions": info.partitions})


def _decode_topic(path: str, data: bytes) -> TopicInfo:
    obj = unseal(path, data, TOPIC_MAGIC, "topic metadata file")
    if not isinstance(obj, dict) or obj.get("format") != TOPIC_FORMAT:
        raise CorruptFileError(path, "unsupported topic metadata format")
    name, tid, n = obj.get("name"), obj.get("topic_id"), obj.get("partitions")
    if not (isinstance(name, str) and isinstance(tid, bytes) and len(tid) == 16
            and isinstance(n, int) and not isinstance(n, bool) and n >= 1):
        raise CorruptFileError(path, f"bad topic metadata {obj!r}")
    return TopicInfo(name, uuid.UUID(bytes=tid), n)


class Storage:
    def __init__(self, data_dir: str, *, default_partitions: int = 1, auto_create: bool = True,
                 max_topics: int | None = None, max_partitions: int | None = None,
                 max_open_segments: int | None = DEFAULT_MAX_OPEN_SEGMENTS, **partition_options: Any):
        """``partition_options`` go to every ``Partition`` (dedup, segment_bytes, retention_bytes,
        retention_ms, ...).  ``max_topics`` / ``max_partitions`` bound creation (None: no limit);
        ``max_open_segments`` bounds the segment files open at once, all partitions together."""
        if default_partitions < 1:
            raise ValueError("default_partitions must be at least 1")
        for name, value in (("max_topics", max_topics), ("max_partitions", max_partitions)):
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1 (or None: no limit)")
        self.data_dir = os.path.abspath(data_dir)
        self.default_partitions = default_partitions
        self.auto_create = auto_create
        self.max_topics = max_topics
        self.max_partitions = max_partitions
        self.segment_files = SegmentFiles(max_open_segments)
        self.partition_options = partition_options
        self.refused_creations = 0
        self._lock = threading.Lock()
        self._topics: dict[str, TopicInfo] = {}
        self._partitions: dict[tuple[str, int], Partition] = {}
        self._closed = False
        os.makedirs(self.data_dir, exist_ok=True)
        try:
            self._open()
        except BaseException:
            self._close_partitions()
            raise

    def _meta_path(self, name: str) -> str:
        return os.path.join(self.data_dir, topic_stem(name) + TOPIC_SUFFIX)

    def _partition_dir(self, name: str, p: int) -> str:
        return os.path.join(self.data_dir, f"{topic_stem(name)}-{p}")

    def _open(self) -> None:
        names = sorted(os.listdir(self.data_dir))
        for fname in names:
            if not fname.endswith(TOPIC_SUFFIX):
                continue
            path = os.path.join(self.data_dir, fname)
            with open(path, "rb") as f:
                info = _decode_topic(path, f.read())
            if topic_stem(info.name) != fname[:-len(TOPIC_SUFFIX)]:
                raise CorruptFileError(path, f"holds the metadata of topic {info.name!r}")
            for p in range(info.partitions):
                d = self._partition_dir(info.name, p)
                if not os.path.isdir(d):
                    raise CorruptFileError(path, f"topic {info.name!r} has {info.partitions} partitions but the "
                                                 f"directory {os.path.basename(d)} is missing")
            self._topics[info.name] = info
            for p in range(info.partitions):
                self._partitions[(info.name, p)] = self._open_partition(info.name, p)
        known = {(topic_stem(name), p) for name, p in self._partitions}
        for fname in names:
            m = _PARTITION_DIR.match(fname)
            if m and os.path.isdir(os.path.join(self.data_dir, fname)) and (m.group(1), int(m.group(2))) \
                    not in known:
                log.warning("storage %s: directory %s belongs to no topic (a topic creation cut by a crash?); "
                            "it is reused if that topic is created again", self.data_dir, fname)
        if (self.max_topics is not None and len(self._topics) > self.max_topics) or \
                (self.max_partitions is not None and len(self._partitions) > self.max_partitions):
            log.warning("storage %s: %d topics, %d partitions on disk, over the limits (max_topics %s, "
                        "max_partitions %s): all are open, new topics are refused", self.data_dir,
                        len(self._topics), len(self._partitions), self.max_topics, self.max_partitions)

    def _open_partition(self, name: str, p: int) -> Partition:
        return Partition(self._partition_dir(name, p), segment_files=self.segment_files, **self.partition_options)

    # ================================================================ topics
    def topics(self) -> list[TopicInfo]:
        with self._lock:
            return sorted(self._topics.values(), key=lambda t: t.name)

    def topic(self, name: str) -> TopicInfo | None:
        with self._lock:
            return self._topics.get(name)

    def ensure_topic(self, name: str, partitions: int | None = None) -> TopicInfo:
        """The topic, created with ``partitions`` (default ``default_partitions``) if it does not exist.

        An existing topic keeps its partition count whatever ``partitions`` says.  A new one over
        ``max_topics`` / ``max_partitions`` raises ``UnknownTopicOrPartitionError``.
        """
        validate_topic_name(name)
        if partitions is not None and partitions < 1:
            raise ValueError("partitions must be at least 1")
        with self._lock:
            self._check_open()
            info = self._topics.get(name)
            if info is None:
                info = self._create(name, partitions or self.default_partitions)
            return info

    def _check_limits(self, name: str, n: int) -> None:
        problem = None
        if self.max_topics is not None and len(self._topics) >= self.max_topics:
            problem = f"the broker holds {len(self._topics)} topics, its limit (max_topics)"
        elif self.max_partitions is not None and len(self._partitions) + n > self.max_partitions:
            problem = (f"its {n} partitions would make {len(self._partitions) + n}, over the broker's limit of "
                       f"{self.max_partitions} (max_partitions)")
        if problem is None:
            return
        self.refused_creations += 1
        if self.refused_creations == 1 or self.refused_creations % 1000 == 0:
            log.warning("storage %s: refused to create topic %r: %s (%d refusals so far)", self.data_dir, name,
                        problem, self.refused_creations)
        raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist and cannot be created: {problem}")

    def _create(self, name: str, n: int) -> TopicInfo:
        """The partition directories, then the metadata file (atomically): the topic exists once that
        file does.  On a failure, what this creation made is removed again (``_undo_create``)."""
        self._check_limits(name, n)
        info = TopicInfo(name, uuid.uuid4(), n)
        opened: list[Partition] = []
        made: list[str] = []  # directories this creation made (not those a crashed creation left)
        try:
            for p in range(n):
                d = self._partition_dir(name, p)
                if not os.path.isdir(d):
                    made.append(d)
                opened.append(self._open_partition(name, p))
            atomic_write(self._meta_path(name), _encode_topic(info))
        except BaseException as e:
            self._undo_create(name, opened, made, e)
            raise
        for p, part in enumerate(opened):
            self._partitions[(name, p)] = part
        self._topics[name] = info
        log.info("storage %s: created topic %s (%d partitions, id %s)", self.data_dir, name, n, info.topic_id)
        return info

    def _undo_create(self, name: str, opened: list[Partition], made: list[str], error: BaseException) -> None:
        """A failed creation leaves nothing behind: its partitions closed, the directories it made and
        the metadata file's temporary file removed (the data directory synced), the failure logged."""
        for part in opened:
            try:
                part.close()
            except Exception:  # noqa: BLE001 - undo the rest; the creation's own error is raised
                log.exception("storage %s: closing a partition of the failed topic %r", self.data_dir, name)
        left = []
        for path in [*made, self._meta_path(name) + TMP_SUFFIX]:
            try:
                if os.path.isdir(path):
                    shutil.rmtree(path)
                elif os.path.lexists(path):
                    os.unlink(path)
            except OSError as e:
                left.append(f"{os.path.basename(path)} ({e.strerror})")
        try:
            fsync_dir(self.data_dir)
        except OSError as e:
            left.append(f"the directory sync ({e})")
        log.error("storage %s: creating topic %r failed: %s: %s; removed what it made%s", self.data_dir, name,
                  type(error).__name__, error, f", except {', '.join(left)}" if left else "")

    def partition(self, topic: str, p: int) -> Partition:
        """The partition, creating its topic first if ``auto_create`` (else, or over the limits,
        UnknownTopicOrPartitionError)."""
        validate_topic_name(topic)
        with self._lock:
            self._check_open()
            info = self._topics.get(topic)
            if info is None:
                if not self.auto_create:
                    raise UnknownTopicOrPartitionError(f"unknown topic {topic!r}")
                info = self._create(topic, self.default_partitions)
            if not isinstance(p, int) or isinstance(p, bool) or not 0 <= p < info.partitions:
                raise UnknownTopicOrPartitionError(f"topic {topic!r} has partitions 0..{info.partitions - 1}, "
                                                   f"not {p!r}")
            return self._partitions[(topic, p)]

    # =========================================================== maintenance
    def maintain(self) -> None:
        """Expiry and retention of every partition (``Partition.maintain``), for partitions nobody writes
        to; the broker calls it every few seconds from an I/O thread."""
        with self._lock:
            if self._closed:
                return
            parts = list(self._partitions.values())
        for part in parts:
            part.maintain()

    def producer_stats(self) -> dict[str, int]:
        """Producer-state figures summed over the partitions (metrics)."""
        with self._lock:
            parts = list(self._partitions.values())
        out: dict[str, int] = {}
        for part in parts:
            for k, v in part.producer_stats().items():
                out[k] = out.get(k, 0) + v
        return out

    # ================================================================= close
    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"storage {self.data_dir} is closed")

    def _close_partitions(self) -> None:
        errors = []
        for part in self._partitions.values():
            try:
                part.close()
            except Exception as e:  # noqa: BLE001 - close the others, then report
                errors.append(e)
        if errors:
            raise errors[0]

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._close_partitions()

    def __enter__(self) -> "Storage":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
