"""All partitions of a broker under one data directory, with topics created on first use (bounded by
``max_topics`` / ``max_partitions``) or by the Admin API (``create_topic``, ``delete_topic``,
``create_partitions``), each with its own topic configs (``TOPIC_CONFIGS``).  Layout, long topic names,
crash-safe creation and deletion and the limits' error code: docs/brokers.md, "A broker's data directory" and
"Topic administration".  Thread-safe: the storage lock, then each partition's own.
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

from .log import DEFAULT_SEGMENT_BYTES
from .partition import DEFAULT_MAX_BATCH_BYTES, Partition
from .segment_files import SegmentFiles

log = logging.getLogger(__name__)

TOPIC_SUFFIX = ".topic"
TOPIC_MAGIC = b"PQTOPC\x00\x01"
TOPIC_FORMAT = 2  # 2: the topic's configs; format 1 files (no configs) are still read
TOPIC_FORMATS_READ = (1, 2)
DELETED_SUFFIX = ".deleted"  # a topic being deleted: its metadata file renamed (fits where ".topic.tmp" does)
DELETING_PREFIX = "~deleted-"  # a deleted partition's directory, renamed before its removal ("~": no topic's)
RESERVED_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})  # Kafka's internal topics
MAX_TOPIC_PARTITIONS = 10_000  # partitions of one topic, as ``default_partitions``' bound
MAX_TOPIC_NAME = 249
MAX_ENTRY_NAME = 255  # bytes of one directory entry (ext4, xfs, btrfs, tmpfs)
TMP_SUFFIX = ".tmp"  # snapshots.storage.disk.Disk.write_file writes <path>.tmp, then renames it
SHORT_STEM_PREFIX = 200  # characters of a long name kept in its stem, before "+<hash>"
_LEGAL = re.compile(r"^[a-zA-Z0-9._-]+$")
_PARTITION_DIR = re.compile(r"^(.+)-(\d+)$")
DEFAULT_MAX_OPEN_SEGMENTS = 1000
# ``Partition``'s own defaults of the options a topic config sets (what a broker that passes none has).
_PARTITION_DEFAULTS = {"segment_bytes": DEFAULT_SEGMENT_BYTES, "max_batch_bytes": DEFAULT_MAX_BATCH_BYTES,
                       "retention_ms": None, "retention_bytes": None}

# The classes errors.py registers for these codes (one class per code).
InvalidTopicError = type(for_code(Errors.INVALID_TOPIC_EXCEPTION))
UnknownTopicOrPartitionError = type(for_code(Errors.UNKNOWN_TOPIC_OR_PARTITION))

TOPIC_ALREADY_EXISTS, INVALID_PARTITIONS = int(Errors.TOPIC_ALREADY_EXISTS), int(Errors.INVALID_PARTITIONS)
INVALID_REPLICATION_FACTOR, INVALID_CONFIG = int(Errors.INVALID_REPLICATION_FACTOR), int(Errors.INVALID_CONFIG)
INVALID_REPLICA_ASSIGNMENT, POLICY_VIOLATION = int(Errors.INVALID_REPLICA_ASSIGNMENT), int(Errors.POLICY_VIOLATION)
UNKNOWN_TOPIC_ID = int(Errors.UNKNOWN_TOPIC_ID)


class TopicAdminError(Exception):
    """A topic administration request refused, with Kafka's error code and a message for the client."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code, self.message = int(code), message


@dataclass(frozen=True, slots=True)
class TopicConfigDef:
    """One topic config served: its Kafka name, the ``Partition`` option it sets, the broker setting it
    overrides (Kafka's synonym), its Kafka type (DescribeConfigs' config_type), bounds and documentation."""
    name: str
    option: str
    broker_name: str
    config_type: int  # Kafka's ConfigType: 1 BOOLEAN, 2 STRING, 3 INT, 5 LONG, 6 DOUBLE, 7 LIST
    minimum: int | None
    maximum: int | None
    doc: str
    default: str | None = None  # a config not applied here: Kafka's default (what a topic without a value has)
    choices: tuple[str, ...] = ()  # a STRING config's values

    @property
    def applied(self) -> bool:
        return bool(self.option) or self.name == "cleanup.policy"


CONFIG_BOOLEAN, CONFIG_STRING, CONFIG_INT, CONFIG_LONG, CONFIG_DOUBLE, CONFIG_LIST = 1, 2, 3, 5, 6, 7
_I32, _I64 = 2**31 - 1, 2**63 - 1
_KEPT = "Accepted and kept (DescribeConfigs shows it), not applied by this broker: "


def _kept(name: str, broker_name: str, config_type: int, default: str, doc: str, minimum: int | None = None,
          maximum: int | None = None, choices: tuple[str, ...] = ()) -> "TopicConfigDef":
    """A Kafka topic config this broker takes (CreateTopics, AlterConfigs) and keeps, but does not act on:
    what it governs (compaction, replicas, recompression, flushing by count) is not served here.  Kafka
    accepts every topic config it knows, so applications and tools that set them work; refusing them
    would fail topic creation for a setting that changes nothing on one replica."""
    return TopicConfigDef(name, "", broker_name, config_type, minimum, maximum, _KEPT + doc, default, choices)
TOPIC_CONFIGS: dict[str, TopicConfigDef] = {d.name: d for d in (
    TopicConfigDef("cleanup.policy", "", "log.cleanup.policy", CONFIG_LIST, None, None,
                   "What happens to old segments: \"delete\" (the only policy served; compaction is not)."),
    TopicConfigDef("max.message.bytes", "max_batch_bytes", "message.max.bytes", CONFIG_INT, 0, _I32,
                   "The largest record batch size allowed in this topic."),
    TopicConfigDef("retention.bytes", "retention_bytes", "log.retention.bytes", CONFIG_LONG, -1, _I64,
                   "Old segments of a partition are deleted while its log is larger than this (-1: no limit)."),
    TopicConfigDef("retention.ms", "retention_ms", "log.retention.ms", CONFIG_LONG, -1, _I64,
                   "A sealed segment is deleted once its newest record is this old (-1: never)."),
    TopicConfigDef("segment.bytes", "segment_bytes", "log.segment.bytes", CONFIG_INT, 1024, _I32,
                   "Size at which a partition's log rolls to a new segment."),
    _kept("compression.type", "compression.type", CONFIG_STRING, "producer",
          "batches are stored as the producer compressed them (\"producer\").",
          choices=("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")),
    _kept("delete.retention.ms", "log.cleaner.delete.retention.ms", CONFIG_LONG, "86400000",
          "tombstone retention of compacted topics (no compaction here).", 0, _I64),
    _kept("file.delete.delay.ms", "log.segment.delete.delay.ms", CONFIG_LONG, "60000",
          "segments are deleted at once.", 0, _I64),
    _kept("flush.messages", "log.flush.interval.messages", CONFIG_LONG, str(_I64),
          "every append is fsync'd before it is answered.", 1, _I64),
    _kept("flush.ms", "log.flush.interval.ms", CONFIG_LONG, str(_I64),
          "every append is fsync'd before it is answered.", 0, _I64),
    _kept("index.interval.bytes", "log.index.interval.bytes", CONFIG_INT, "4096",
          "every batch is indexed.", 0, _I32),
    _kept("max.compaction.lag.ms", "log.cleaner.max.compaction.lag.ms", CONFIG_LONG, str(_I64),
          "no compaction here.", 1, _I64),
    _kept("message.timestamp.type", "log.message.timestamp.type", CONFIG_STRING, "CreateTime",
          "records keep the producer's timestamps (CreateTime).", choices=("CreateTime", "LogAppendTime")),
    _kept("message.timestamp.difference.max.ms", "log.message.timestamp.difference.max.ms", CONFIG_LONG,
          str(_I64), "timestamps are not checked against the broker's clock.", 0, _I64),
    _kept("min.cleanable.dirty.ratio", "log.cleaner.min.cleanable.ratio", CONFIG_DOUBLE, "0.5",
          "no compaction here."),
    _kept("min.compaction.lag.ms", "log.cleaner.min.compaction.lag.ms", CONFIG_LONG, "0",
          "no compaction here.", 0, _I64),
    _kept("min.insync.replicas", "min.insync.replicas", CONFIG_INT, "1",
          "a partition has one replica; more than 1 could never be met, and is refused.", 1, 1),
    _kept("preallocate", "log.preallocate", CONFIG_BOOLEAN, "false", "segments are not preallocated."),
    _kept("segment.index.bytes", "log.index.size.max.bytes", CONFIG_INT, "10485760",
          "the index grows with the segment.", 4, _I32),
    _kept("segment.jitter.ms", "log.roll.jitter.ms", CONFIG_LONG, "0", "segments roll by size.", 0, _I64),
    _kept("segment.ms", "log.roll.ms", CONFIG_LONG, "604800000", "segments roll by size (segment.bytes).", 1,
          _I64),
    _kept("unclean.leader.election.enable", "unclean.leader.election.enable", CONFIG_BOOLEAN, "false",
          "a partition has one replica and one leader."),
    _kept("message.downconversion.enable", "log.message.downconversion.enable", CONFIG_BOOLEAN, "true",
          "record batches are served as stored (v2)."),
)}
_INTEGER = re.compile(r"^[+-]?\d{1,20}$")


def parse_topic_configs(pairs: Any) -> dict[str, str]:
    """{name: value} of (name, value) pairs, each checked (``TOPIC_CONFIGS``) and normalized; an unknown
    name, a null, repeated or absurd value raises ``TopicAdminError`` (INVALID_CONFIG) saying which."""
    out: dict[str, str] = {}
    for name, value in pairs:
        d = TOPIC_CONFIGS.get(name)
        if d is None:
            raise TopicAdminError(INVALID_CONFIG, f"unknown topic config {str(name)[:200]!r} (served: "
                                                  f"{', '.join(sorted(TOPIC_CONFIGS))})")
        if name in out:
            raise TopicAdminError(INVALID_CONFIG, f"topic config {name!r} is given more than once")
        if value is None:
            raise TopicAdminError(INVALID_CONFIG, f"null value not supported for topic config {name!r}")
        value = str(value).strip()
        if d.config_type == CONFIG_LIST:
            policies = [p.strip() for p in value.split(",") if p.strip()]
            if "compact" in policies:
                raise TopicAdminError(INVALID_CONFIG, "cleanup.policy=compact: compaction is not served by this "
                                                      "broker (only \"delete\")")
            if policies != ["delete"]:
                raise TopicAdminError(INVALID_CONFIG, f"cleanup.policy={value[:100]!r}: only \"delete\" is served")
            out[name] = "delete"
            continue
        if d.config_type == CONFIG_BOOLEAN:
            if value.lower() not in ("true", "false"):
                raise TopicAdminError(INVALID_CONFIG, f"{name}={value[:100]!r} is not true or false")
            out[name] = value.lower()
            continue
        if d.config_type == CONFIG_STRING:
            if d.choices and value not in d.choices:
                raise TopicAdminError(INVALID_CONFIG, f"{name}={value[:100]!r} is not one of {', '.join(d.choices)}")
            out[name] = value
            continue
        if d.config_type == CONFIG_DOUBLE:
            try:
                x = float(value)
            except ValueError:
                x = float("nan")
            if not 0.0 <= x <= 1.0:
                raise TopicAdminError(INVALID_CONFIG, f"{name}={value[:100]!r} is not a number in [0, 1]")
            out[name] = repr(x)
            continue
        if not _INTEGER.match(value):
            raise TopicAdminError(INVALID_CONFIG, f"{name}={value[:100]!r} is not an integer")
        n = int(value)
        if not d.minimum <= n <= d.maximum:
            raise TopicAdminError(INVALID_CONFIG, f"{name}={n} is out of range [{d.minimum}, {d.maximum}]")
        out[name] = str(n)
    return out


def check_reserved(name: str) -> None:
    """Raise ``InvalidTopicError`` if ``name`` is one of Kafka's internal topics (``RESERVED_TOPICS``)."""
    if name in RESERVED_TOPICS:
        raise InvalidTopicError(f"topic {name!r} is internal (reserved for the broker): it cannot be created")


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
    configs: tuple[tuple[str, str], ...] = ()  # the topic's own configs (overrides), sorted by name

    @property
    def config(self) -> dict[str, str]:
        return dict(self.configs)


def _encode_topic(info: TopicInfo) -> bytes:
    return seal(TOPIC_MAGIC, {"format": TOPIC_FORMAT, "name": info.name, "topic_id": info.topic_id.bytes,
                              "partitions": info.partitions, "configs": dict(info.configs)})


def _decode_topic(path: str, data: bytes) -> TopicInfo:
    obj = unseal(path, data, TOPIC_MAGIC, "topic metadata file")
    if not isinstance(obj, dict) or obj.get("format") not in TOPIC_FORMATS_READ:
        raise CorruptFileError(path, "unsupported topic metadata format")
    name, tid, n = obj.get("name"), obj.get("topic_id"), obj.get("partitions")
    configs = obj.get("configs", {})
    if not (isinstance(name, str) and isinstance(tid, bytes) and len(tid) == 16
            and isinstance(n, int) and not isinstance(n, bool) and n >= 1 and isinstance(configs, dict)):
        raise CorruptFileError(path, f"bad topic metadata {obj!r}")
    try:
        checked = parse_topic_configs(configs.items())
    except TopicAdminError as e:
        raise CorruptFileError(path, f"topic {name!r}: {e.message}") from None
    return TopicInfo(name, uuid.UUID(bytes=tid), n, tuple(sorted(checked.items())))


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
        self._finish_deletions()
        names = sorted(os.listdir(self.data_dir))
        for fname in names:
            if not fname.endswith(TOPIC_SUFFIX):
                continue
            path = os.path.join(self.data_dir, fname)
            with open(path, "rb") as f:
                info = _decode_topic(path, f.read())
            if topic_stem(info.name) != fname[:-len(TOPIC_SUFFIX)]:
                raise CorruptFileError(path, f"holds the metadata of topic {info.name!r}")
            if info.name in RESERVED_TOPICS:
                log.warning("storage %s: topic %r is a reserved (internal) name; opened as it is on disk, but "
                            "no new topic of that name can be created", self.data_dir, info.name)
            for p in range(info.partitions):
                d = self._partition_dir(info.name, p)
                if not os.path.isdir(d):
                    raise CorruptFileError(path, f"topic {info.name!r} has {info.partitions} partitions but the "
                                                 f"directory {os.path.basename(d)} is missing")
            self._topics[info.name] = info
            for p in range(info.partitions):
                self._partitions[(info.name, p)] = self._open_configured(info.name, p, info.configs)
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

    def _finish_deletions(self) -> None:
        """What a deletion cut by a crash left (``delete_topic``): the partition directories of each topic
        whose metadata file was renamed to ``<stem>.deleted`` are removed, then that file; directories
        already renamed ``~deleted-...`` are removed.  Each removal is synced before the next step."""
        for fname in sorted(os.listdir(self.data_dir)):
            path = os.path.join(self.data_dir, fname)
            if fname.endswith(DELETED_SUFFIX) and os.path.isfile(path):
                self._finish_deletion(path)
            elif fname.startswith(DELETING_PREFIX) and os.path.isdir(path):
                shutil.rmtree(path)
                log.info("storage %s: removed %s, a partition of a deleted topic", self.data_dir, fname)

    def _finish_deletion(self, tombstone: str) -> None:
        """Finish the deletion of the topic whose metadata file is ``tombstone``: its partition directories, then
        ``tombstone``, each synced.  At open, and before a topic of that stem is created (a deletion an error cut)."""
        with open(tombstone, "rb") as f:
            info = _decode_topic(tombstone, f.read())
        for p in range(info.partitions):
            if os.path.isdir(self._partition_dir(info.name, p)):
                shutil.rmtree(self._partition_dir(info.name, p))
        fsync_dir(self.data_dir)
        os.unlink(tombstone)
        fsync_dir(self.data_dir)
        log.warning("storage %s: finished the deletion of topic %r (id %s) that a crash or an error cut",
                    self.data_dir, info.name, info.topic_id)

    def _tombstone(self, name: str) -> str:
        return self._meta_path(name)[:-len(TOPIC_SUFFIX)] + DELETED_SUFFIX

    def partition_options_of(self, configs: tuple[tuple[str, str], ...] = ()) -> dict[str, Any]:
        """The ``Partition`` options of a topic with ``configs``: the broker's, each overridden by the
        topic's own value (-1 retention: None, no limit)."""
        options = dict(self.partition_options)
        for name, value in configs:
            d = TOPIC_CONFIGS[name]
            if d.option:
                n = int(value)
                options[d.option] = None if n == -1 and d.option.startswith("retention") else n
        return options

    def default_config(self, name: str) -> str:
        """The broker's value of topic config ``name`` (what a topic without its own value has)."""
        d = TOPIC_CONFIGS[name]
        if not d.option:
            return "delete" if d.default is None else d.default
        v = self.partition_options.get(d.option, _PARTITION_DEFAULTS.get(d.option))
        return "-1" if v is None else str(int(v))

    def _open_partition(self, name: str, p: int, configs: tuple[tuple[str, str], ...] = ()) -> Partition:
        return Partition(self._partition_dir(name, p), segment_files=self.segment_files,
                         **self.partition_options_of(configs))

    def _open_configured(self, name: str, p: int, configs: tuple[tuple[str, str], ...]) -> Partition:
        """``_open_partition``, called as (name, p) for a topic of the broker's defaults (a test may replace it)."""
        return self._open_partition(name, p, configs) if configs else self._open_partition(name, p)

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
                check_reserved(name)
                info = self._create(name, partitions or self.default_partitions)
            return info

    def _check_limits(self, name: str, n: int, admin: bool = False) -> None:
        """Over ``max_topics`` / ``max_partitions``: auto-creation gets UnknownTopicOrPartitionError (the topic
        does not exist), CreateTopics / CreatePartitions (``admin``) POLICY_VIOLATION, as Kafka answers
        a creation its policy refuses."""
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
        if admin:
            raise TopicAdminError(POLICY_VIOLATION, f"topic {name!r}: {problem}")
        raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist and cannot be created: {problem}")

    def _create(self, name: str, n: int, configs: tuple[tuple[str, str], ...] = (), admin: bool = False) -> TopicInfo:
        """The partition directories, then the metadata file (atomically): the topic exists once that
        file does.  On a failure, what this creation made is removed again (``_undo_create``)."""
        self._check_limits(name, n, admin)
        if os.path.exists(self._tombstone(name)):  # a deletion of this name failed half-way: finish it first
            self._finish_deletion(self._tombstone(name))
        info = TopicInfo(name, uuid.uuid4(), n, configs)
        opened: list[Partition] = []
        made: list[str] = []  # directories this creation made (not those a crashed creation left)
        try:
            for p in range(n):
                d = self._partition_dir(name, p)
                if not os.path.isdir(d):
                    made.append(d)
                opened.append(self._open_configured(name, p, configs))
            atomic_write(self._meta_path(name), _encode_topic(info))
        except BaseException as e:
            self._undo_create(name, opened, made, e)
            raise
        for p, part in enumerate(opened):
            self._partitions[(name, p)] = part
        self._topics[name] = info
        log.info("storage %s: created topic %s (%d partitions, id %s)", self.data_dir, name, n, info.topic_id)
        return info

    def _undo_create(self, name: str, opened: list[Partition], made: list[str], error: BaseException,
                     new_topic: bool = True) -> None:
        """A failed creation leaves nothing behind: its partitions closed, its metadata file (if the rename
        happened and only a later sync failed: the topic did not exist before, so the file is this creation's)
        and its temporary file removed first, then the directories it made (so no crash in between leaves a
        metadata file naming missing directories), the data directory synced, the failure logged.  A growth
        (``new_topic`` False) keeps the topic's metadata file: it is the existing topic's, and may already name
        the new partitions."""
        for part in opened:
            try:
                part.close()
            except Exception:  # noqa: BLE001 - undo the rest; the creation's own error is raised
                log.exception("storage %s: closing a partition of the failed topic %r", self.data_dir, name)
        left = []
        meta = [self._meta_path(name)] if new_topic else []
        for path in [*meta, self._meta_path(name) + TMP_SUFFIX, *made]:
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
                check_reserved(topic)
                info = self._create(topic, self.default_partitions)
            if not isinstance(p, int) or isinstance(p, bool) or not 0 <= p < info.partitions:
                raise UnknownTopicOrPartitionError(f"topic {topic!r} has partitions 0..{info.partitions - 1}, "
                                                   f"not {p!r}")
            return self._partitions[(topic, p)]

    # ========================================================= administration
    def create_topic(self, name: Any, partitions: int, configs: dict[str, str],
                     validate_only: bool = False) -> TopicInfo:
        """CreateTopics for one topic (``partitions`` -1: ``default_partitions``; ``configs`` checked by
        ``parse_topic_configs``): the new topic, or, ``validate_only``, what it would be (topic id zero),
        having checked everything creation checks.  Refusals raise InvalidTopicError or TopicAdminError."""
        validate_topic_name(name)
        check_reserved(name)
        n = self.default_partitions if partitions == -1 else partitions
        if not 1 <= n <= MAX_TOPIC_PARTITIONS:
            raise TopicAdminError(INVALID_PARTITIONS, f"number of partitions {partitions} is not -1 (the broker's "
                                                      f"default) or in [1, {MAX_TOPIC_PARTITIONS}]")
        cfg = tuple(sorted(configs.items()))
        with self._lock:
            self._check_open()
            if name in self._topics:
                raise TopicAdminError(TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
            twin = next((t for t in self._topics if t.replace(".", "_") == name.replace(".", "_")), None)
            if twin is not None:
                raise InvalidTopicError(f"topic {name!r} collides with existing topic {twin!r} ('.' and '_' "
                                        f"are the same in metric names)")
            if validate_only:
                self._check_limits(name, n, admin=True)
                return TopicInfo(name, uuid.UUID(int=0), n, cfg)
            return self._create(name, n, cfg, admin=True)

    def create_partitions(self, name: Any, count: int, validate_only: bool = False) -> TopicInfo:
        """CreatePartitions: grow topic ``name`` to ``count`` partitions.  The new partitions' directories
        first, then the metadata file (atomically): a crash or failure in between leaves empty directories
        of no topic, reused when it grows again."""
        validate_topic_name(name)
        with self._lock:
            self._check_open()
            info = self._topics.get(name)
            if info is None:
                raise UnknownTopicOrPartitionError(f"unknown topic {name!r}")
            if count <= info.partitions:
                raise TopicAdminError(INVALID_PARTITIONS, f"topic {name!r} has {info.partitions} partitions; "
                                                          f"the new count ({count}) must be larger")
            if count > MAX_TOPIC_PARTITIONS:
                raise TopicAdminError(INVALID_PARTITIONS, f"{count} partitions: at most {MAX_TOPIC_PARTITIONS} "
                                                          f"per topic")
            if self.max_partitions is not None and len(self._partitions) + count - info.partitions > \
                    self.max_partitions:
                raise TopicAdminError(POLICY_VIOLATION, f"{count - info.partitions} more partitions would make "
                                                        f"{len(self._partitions) + count - info.partitions}, over "
                                                        f"the broker's limit of {self.max_partitions}")
            grown = TopicInfo(name, info.topic_id, count, info.configs)
            if validate_only:
                return grown
            opened: list[Partition] = []
            try:
                for p in range(info.partitions, count):
                    opened.append(self._open_configured(name, p, info.configs))
                atomic_write(self._meta_path(name), _encode_topic(grown))
            except BaseException as e:
                # The new directories stay: the metadata file may name them already (its rename done, the
                # directory sync failed); if not, they are empty ones of no topic, reused by the next growth.
                self._undo_create(name, opened, [], e, new_topic=False)
                raise
            for p, part in enumerate(opened, info.partitions):
                self._partitions[(name, p)] = part
            self._topics[name] = grown
            log.info("storage %s: topic %s grew from %d to %d partitions", self.data_dir, name, info.partitions,
                     count)
            return grown

    def delete_topic(self, name: str | None = None, topic_id: uuid.UUID | None = None) -> TopicInfo:
        """DeleteTopics for one topic, by name or by id.  Crash-safe, each step synced before the next:
        the metadata file is renamed ``<stem>.deleted`` (from then on a restart finishes the deletion,
        ``_finish_deletions``), the partitions are closed and their directories renamed ``~deleted-<id>-<p>``,
        the renamed metadata file is removed; the directories' contents are removed last."""
        with self._lock:
            self._check_open()
            if name is None:
                info = next((t for t in self._topics.values() if t.topic_id == topic_id), None)
                if info is None:
                    raise TopicAdminError(UNKNOWN_TOPIC_ID, f"no topic has the id {topic_id}")
            else:
                validate_topic_name(name)
                info = self._topics.get(name)
                if info is None:
                    raise UnknownTopicOrPartitionError(f"unknown topic {name!r}")
            name = info.name
            tombstone = self._tombstone(name)
            os.rename(self._meta_path(name), tombstone)
            fsync_dir(self.data_dir)
            del self._topics[name]
            parts = [self._partitions.pop((name, p)) for p in range(info.partitions)]
            renamed = []
            for p, part in enumerate(parts):
                try:
                    part.close()
                except Exception:  # noqa: BLE001 - the topic goes anyway; its files are removed below
                    log.exception("storage %s: closing partition %d of deleted topic %r", self.data_dir, p, name)
                target = os.path.join(self.data_dir, f"{DELETING_PREFIX}{info.topic_id.hex}-{p}")
                if os.path.isdir(self._partition_dir(name, p)):
                    os.rename(self._partition_dir(name, p), target)
                    renamed.append(target)
            fsync_dir(self.data_dir)
            os.unlink(tombstone)
            fsync_dir(self.data_dir)
        for d in renamed:
            shutil.rmtree(d, ignore_errors=True)  # what is left is removed at the next start
        log.info("storage %s: deleted topic %s (%d partitions, id %s)", self.data_dir, name, info.partitions,
                 info.topic_id)
        return info

    def alter_topic_configs(self, name: str, configs: dict[str, str], validate_only: bool = False) -> TopicInfo:
        """Replace topic ``name``'s own configs by ``configs`` (checked); durable (the metadata file,
        atomically) before its partitions use them."""
        with self._lock:
            self._check_open()
            info = self._topics.get(name)
            if info is None:
                raise UnknownTopicOrPartitionError(f"unknown topic {name!r}")
            new = TopicInfo(name, info.topic_id, info.partitions, tuple(sorted(configs.items())))
            if validate_only:
                return new
            atomic_write(self._meta_path(name), _encode_topic(new))
            self._topics[name] = new
            options = self.partition_options_of(new.configs)
            for p in range(info.partitions):
                self._partitions[(name, p)].reconfigure(options)
            return new

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
