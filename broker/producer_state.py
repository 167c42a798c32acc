"""Idempotent-producer state of one partition: sequence checks, duplicate detection, snapshots.

Per producer ID the manager keeps the epoch, the metadata of the last 5
batches appended (first/last sequence, first/last offset, max timestamp; a
client keeps at most 5 requests in flight, so a retry is always among them) and
the broker's wall-clock time of the last append.

The rules ``check`` applies to a batch with a producer ID (as Kafka's broker):

* epoch below the stored one: INVALID_PRODUCER_EPOCH (a fenced, older instance);
* epoch above the stored one: a new epoch must start at sequence 0, else
  OUT_OF_ORDER_SEQUENCE_NUMBER;
* same epoch and the same (first, last) sequence as a cached batch: DUPLICATE,
  answered with that batch's offsets and appended nowhere;
* same epoch otherwise: the first sequence must follow the stored last one
  (wrapping from 2**31-1 to 0), else OUT_OF_ORDER_SEQUENCE_NUMBER - which is
  also the answer for a retry of a batch older than the 5 cached ones;
* **unknown producer: APPEND, whatever the sequence.**  Kafka answered
  UNKNOWN_PRODUCER_ID here before 2.5; since KIP-360 it accepts, because the
  broker cannot tell a gap from state that is simply gone: a producer idle for
  longer than ``producer.id.expiration.ms`` (or whose batches all left the log
  under retention, in brokers that lost state with them) continues at sequence
  N, and refusing it would fail a healthy producer - older clients treat
  UNKNOWN_PRODUCER_ID as fatal or reset their sequences.  The price is that a
  duplicate or a gap arriving after the state expired is not detected; with
  state that survives restarts and segment deletion (below) that only happens
  after a day of silence from the producer.

``check`` is pure; ``check_all`` checks the batches of one request in order,
each against the state as if the earlier ones had been appended; ``update``
records an appended batch.

**Snapshots.**  ``write_snapshot(path, offset)`` stores the whole state as it is
once the log holds every offset below ``offset``:
``MAGIC | u32 length | msgpack body | u32 crc32(body)``, replaced atomically
(``storage.files.atomic_write``).  A damaged file is refused with
``CorruptFileError``.  ``recover`` loads the newest snapshot at offset X and
replays only the batch headers from X to the log end, so opening costs what
was appended since the last snapshot, not the whole history.  The partition
snapshots before it deletes segments, so the state outlives the batches it
came from.

Expiry uses the broker's wall clock at append time (``last_update_ms``), not
the client-supplied batch timestamps.  Batches replayed from the log at
recovery count as updated at recovery time: a producer is then kept a little
longer, never dropped early.  Transactions are not tracked (no ongoing
transaction keeps a producer from expiring).
"""
from __future__ import annotations

import enum
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from storage.disk import CorruptFileError
from storage.files import atomic_write, fsync_dir, seal, unseal
from wire.errors import Errors

from .recordbatch import INT32_MAX, NO_SEQUENCE, BatchHeader, increment_sequence

log = logging.getLogger(__name__)

MAX_CACHED_BATCHES = 5
DEFAULT_PRODUCER_ID_EXPIRATION_MS = 24 * 60 * 60 * 1000  # Kafka's producer.id.expiration.ms
INT16_MAX = 2**15 - 1

SNAPSHOT_MAGIC = b"PQPSTA\x00\x01"
SNAPSHOT_FORMAT = 1
SNAPSHOT_SUFFIX = ".snapshot"
_SNAPSHOT_RE = re.compile(r"^(\d{20})\.snapshot$")


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    max_timestamp: int


@dataclass(slots=True)
class ProducerEntry:
    producer_id: int
    epoch: int
    batches: list[BatchMetadata] = field(default_factory=list)  # oldest first, at most MAX_CACHED_BATCHES
    last_update_ms: int = -1

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1

    def find_batch(self, first_seq: int, last_seq: int) -> BatchMetadata | None:
        for b in self.batches:
            if b.first_seq == first_seq and b.last_seq == last_seq:
                return b
        return None

    def copy(self) -> "ProducerEntry":
        return ProducerEntry(self.producer_id, self.epoch, list(self.batches), self.last_update_ms)


class Action(enum.Enum):
    APPEND = "append"
    DUPLICATE = "duplicate"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    error: Errors = Errors.NONE
    message: str = ""
    first_offset: int = -1  # DUPLICATE: where the original batch is
    last_offset: int = -1

    @property
    def is_error(self) -> bool:
        return self.action is Action.ERROR


APPEND = Decision(Action.APPEND)


def _error(code: Errors, message: str) -> Decision:
    return Decision(Action.ERROR, code, message)


def _apply(entry: ProducerEntry | None, h: BatchHeader, first_offset: int, now_ms: int) -> ProducerEntry:
    """The entry after appending ``h`` at ``first_offset`` (a new object when the epoch changes or none existed)."""
    if entry is None or entry.epoch != h.producer_epoch:
        entry = ProducerEntry(h.producer_id, h.producer_epoch)
    entry.batches.append(BatchMetadata(h.base_sequence, h.last_sequence, first_offset,
                                       first_offset + h.last_offset_delta if first_offset >= 0 else -1,
                                       h.max_timestamp))
    if len(entry.batches) > MAX_CACHED_BATCHES:
        del entry.batches[0]
    entry.last_update_ms = now_ms
    return entry


class ProducerStateManager:
    """Producer state of one partition.  Not thread-safe (the partition serialises calls)."""

    def __init__(self) -> None:
        self._producers: dict[int, ProducerEntry] = {}
        self.recovery_stats: dict[str, int] = {}

    # ------------------------------------------------------------ checking
    @staticmethod
    def _decide(entry: ProducerEntry | None, h: BatchHeader) -> Decision:
        if not h.has_producer_id:
            return APPEND
        pid, epoch, seq = h.producer_id, h.producer_epoch, h.base_sequence
        if entry is None:
            return APPEND  # unknown producer: accepted at any sequence (KIP-360; see the module doc)
        if epoch < entry.epoch:
            return _error(Errors.INVALID_PRODUCER_EPOCH,
                          f"producer {pid}: epoch {epoch} is older than the current epoch {entry.epoch} (fenced)")
        if epoch > entry.epoch:
            if seq != 0:
                return _error(Errors.OUT_OF_ORDER_SEQUENCE_NUMBER,
                              f"producer {pid}: new epoch {epoch} must start at sequence 0, got {seq}")
            return APPEND
        dup = entry.find_batch(seq, h.last_sequence)
        if dup is not None:
            return Decision(Action.DUPLICATE, first_offset=dup.first_offset, last_offset=dup.last_offset,
                            message=f"producer {pid}: duplicate of sequences {seq}..{h.last_sequence} "
                                    f"at offset {dup.first_offset}")
        last = entry.last_seq
        expected = 0 if last == NO_SEQUENCE else increment_sequence(last, 1)
        if seq != expected:
            return _error(Errors.OUT_OF_ORDER_SEQUENCE_NUMBER,
                          f"producer {pid} epoch {epoch}: sequence {seq} does not follow the last sequence "
                          f"{last} (expected {expected})")
        return APPEND

    def check(self, h: BatchHeader) -> Decision:
        """What to do with batch ``h`` given the current state (no change to the state)."""
        return self._decide(self._producers.get(h.producer_id), h)

    def check_all(self, headers: Sequence[BatchHeader], next_offset: int | None = None) -> list[Decision]:
        """Decide for the batches of one request, each as if the earlier APPENDs had been appended.

        ``next_offset`` is where the first appended batch will land (the log
        end); the APPEND batches are assumed to be appended in order and
        contiguously from there, so a later batch that duplicates an earlier
        one of the same request gets exact offsets.  Without it those offsets
        are -1.  Nothing is changed.
        """
        overlay: dict[int, ProducerEntry | None] = {}
        offset = next_offset
        out = []
        for h in headers:
            pid = h.producer_id
            entry = overlay[pid] if pid in overlay else self._producers.get(pid)
            d = self._decide(entry, h)
            if d.action is Action.APPEND:
                if h.has_producer_id:
                    overlay[pid] = _apply(entry.copy() if entry is not None else None, h,
                                          offset if offset is not None else -1, 0)
                if offset is not None:
                    offset += h.last_offset_delta + 1
            out.append(d)
        return out

    # ------------------------------------------------------------ updating
    def update(self, h: BatchHeader, first_offset: int, now_ms: int) -> None:
        """Record that batch ``h`` was appended at ``first_offset`` (no-op without a producer ID)."""
        if not h.has_producer_id:
            return
        self._producers[h.producer_id] = _apply(self._producers.get(h.producer_id), h, first_offset, now_ms)

    def expire(self, now_ms: int, producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS) -> list[int]:
        """Forget producers with no append for ``producer_id_expiration_ms`` or more; return their IDs."""
        gone = [pid for pid, e in self._producers.items() if now_ms - e.last_update_ms >= producer_id_expiration_ms]
        for pid in gone:
            del self._producers[pid]
        return gone

    def producers(self) -> dict[int, ProducerEntry]:
        """A copy of the state, by producer ID."""
        return {pid: e.copy() for pid, e in self._producers.items()}

    def describe(self, limit: int) -> list[tuple[int, int, int, int]]:
        """The ``limit`` lowest producer ids as (producer id, epoch, last sequence, last batch's max timestamp)."""
        out = []
        for pid in sorted(self._producers)[:max(0, limit)]:
            e = self._producers[pid]
            out.append((pid, e.epoch, e.last_seq, e.batches[-1].max_timestamp if e.batches else -1))
        return out

    def get(self, producer_id: int) -> ProducerEntry | None:
        e = self._producers.get(producer_id)
        return e.copy() if e is not None else None

    def __len__(self) -> int:
        return len(self._producers)

    # ------------------------------------------------------------ snapshots
    def encode_snapshot(self, log_end_offset: int) -> bytes:
        return seal(SNAPSHOT_MAGIC, {
            "format": SNAPSHOT_FORMAT,
            "offset": log_end_offset,
            "producers": [[e.producer_id, e.epoch, e.last_update_ms,
                           [[b.first_seq, b.last_seq, b.first_offset, b.last_offset, b.max_timestamp]
                            for b in e.batches]]
                          for e in sorted(self._producers.values(), key=lambda e: e.producer_id)],
        })

    def write_snapshot(self, path: str, log_end_offset: int) -> int:
        """Atomically write the state, valid once the log holds every offset below ``log_end_offset``.

        Returns the file size.
        """
        data = self.encode_snapshot(log_end_offset)
        atomic_write(path, data)
        return len(data)

    def load_snapshot(self, path: str) -> int:
        """Replace the state with the snapshot in ``path``; return the offset it was taken at."""
        offset, producers = read_snapshot(path)
        self._producers = producers
        return offset

    # ------------------------------------------------------------ recovery
    @classmethod
    def recover(cls, directory: str, log_: Any, now_ms: int) -> "ProducerStateManager":
        """Load the newest snapshot in ``directory`` and replay the log's batch headers after it.

        ``log_`` is a ``broker.log.PartitionLog`` (anything with
        ``log_start_offset``, ``log_end_offset`` and ``iter_headers``).  A
        snapshot taken at an offset beyond the log end proves acknowledged
        batches are missing from the log: ``CorruptFileError``.  A damaged
        newest snapshot is refused too (delete it to fall back to the previous
        one).  ``recovery_stats`` tells what was done.
        """
        mgr = cls()
        snaps = list_snapshots(directory)
        end = log_.log_end_offset
        start = log_.log_start_offset
        snap_offset = None
        if snaps:
            offset, path = snaps[-1]
            if offset > end:
                raise CorruptFileError(path, f"producer state snapshot taken at offset {offset} but the log in "
                                             f"{directory} ends at {end}: acknowledged batches are missing from "
                                             f"the log")
            loaded = mgr.load_snapshot(path)
            if loaded != offset:
                raise CorruptFileError(path, f"snapshot says offset {loaded} but its name says {offset}")
            snap_offset = offset
            if offset < start:
                log.warning("producer state %s: snapshot at offset %d is below the log start %d; producers of the "
                            "deleted batches in between are not known", directory, offset, start)
        replayed = 0
        from_offset = start if snap_offset is None else max(snap_offset, start)
        for h in log_.iter_headers(from_offset):
            if snap_offset is not None and h.base_offset < snap_offset:
                continue  # already in the snapshot (only possible if a batch straddles it; ours never do)
            replayed += 1
            mgr.update(h, h.base_offset, now_ms)
        mgr.recovery_stats = {"snapshot_offset": -1 if snap_offset is None else snap_offset,
                              "replayed_batches": replayed, "producers": len(mgr._producers)}
        return mgr

    def take_snapshot(self, directory: str, log_end_offset: int, keep: int = 2) -> str:
        """Write ``<offset>.snapshot`` in ``directory`` and delete all but the newest ``keep`` snapshots."""
        path = snapshot_path(directory, log_end_offset)
        self.write_snapshot(path, log_end_offset)
        old = list_snapshots(directory)[:-keep] if keep > 0 else []
        for _, p in old:
            os.unlink(p)
        if old:
            fsync_dir(directory)
        return path


# ---------------------------------------------------------------- snapshot files

def snapshot_path(directory: str, offset: int) -> str:
    return os.path.join(directory, f"{offset:020d}{SNAPSHOT_SUFFIX}")


def list_snapshots(directory: str) -> list[tuple[int, str]]:
    """``(offset, path)`` of every snapshot file in ``directory``, oldest first."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        m = _SNAPSHOT_RE.match(name)
        if m:
            out.append((int(m.group(1)), os.path.join(directory, name)))
    return sorted(out)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def decode_snapshot(path: str, data: bytes) -> tuple[int, dict[int, ProducerEntry]]:
    obj = unseal(path, data, SNAPSHOT_MAGIC, "producer state snapshot")
    if not isinstance(obj, dict) or obj.get("format") != SNAPSHOT_FORMAT:
        raise CorruptFileError(path, f"unsupported snapshot format "
                                     f"{obj.get('format') if isinstance(obj, dict) else type(obj).__name__}")
    offset = obj.get("offset")
    if not _int(offset) or offset < 0:
        raise CorruptFileError(path, f"bad offset {offset!r}")
    producers: dict[int, ProducerEntry] = {}
    items = obj.get("producers")
    if not isinstance(items, list):
        raise CorruptFileError(path, "producers is not a list")
    for item in items:
        if not (isinstance(item, list) and len(item) == 4 and all(_int(x) for x in item[:3])
                and isinstance(item[3], list)):
            raise CorruptFileError(path, f"bad producer entry {item!r}")
        pid, epoch, last_update, raw_batches = item
        if pid < 0 or not 0 <= epoch <= INT16_MAX:
            raise CorruptFileError(path, f"producer {pid}: bad producer ID or epoch {epoch}")
        if pid in producers:
            raise CorruptFileError(path, f"producer {pid} appears twice")
        if len(raw_batches) > MAX_CACHED_BATCHES:
            raise CorruptFileError(path, f"producer {pid}: {len(raw_batches)} cached batches "
                                         f"(at most {MAX_CACHED_BATCHES})")
        batches = []
        for rb in raw_batches:
            if not (isinstance(rb, list) and len(rb) == 5 and all(_int(x) for x in rb)):
                raise CorruptFileError(path, f"producer {pid}: bad batch entry {rb!r}")
            fs, ls, fo, lo, mts = rb
            if not (0 <= fs <= INT32_MAX and 0 <= ls <= INT32_MAX and 0 <= fo <= lo < offset):
                raise CorruptFileError(path, f"producer {pid}: batch {rb!r} out of range (snapshot offset {offset})")
            batches.append(BatchMetadata(fs, ls, fo, lo, mts))
        producers[pid] = ProducerEntry(pid, epoch, batches, last_update)
    return offset, producers


def read_snapshot(path: str) -> tuple[int, dict[int, ProducerEntry]]:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise CorruptFileError(path, f"cannot read: {e.strerror}") from None
    return decode_snapshot(path, data)

