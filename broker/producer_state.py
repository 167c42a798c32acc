"""Idempotent-producer state of one partition: sequence checks, duplicate detection, snapshots.

Per producer ID the manager keeps the epoch, the metadata of its last batch
(first/last sequence, first/last offset, max timestamp) and the broker's
wall-clock time of its last append.  The four batches before the last one are
kept too, but only while a retry of them can still arrive: a client keeps at
most 5 requests in flight and gives up on a batch after its delivery timeout
(``delivery.timeout.ms``, 2 minutes by default), so a producer that has been
idle for ``retry_window_ms`` (5 minutes by default) cannot retry any batch but
its last one, and its older batches are dropped.

The rules ``check`` applies to a batch with a producer ID (as Kafka's broker):

* epoch below the stored one: INVALID_PRODUCER_EPOCH (a fenced, older instance);
* epoch above the stored one: a new epoch must start at sequence 0, else
  OUT_OF_ORDER_SEQUENCE_NUMBER;
* same epoch and the same (first, last) sequence as a cached batch: DUPLICATE,
  answered with that batch's offsets and appended nowhere;
* same epoch otherwise: the first sequence must follow the stored last one
  (wrapping from 2**31-1 to 0), else OUT_OF_ORDER_SEQUENCE_NUMBER - which is
  also the answer for a retry of a batch older than the cached ones;
* **unknown producer: APPEND, whatever the sequence.**  Kafka answered
  UNKNOWN_PRODUCER_ID here before 2.5; since KIP-360 it accepts, because the
  broker cannot tell a gap from state that is simply gone: a producer idle for
  longer than ``producer.id.expiration.ms`` continues at sequence N, and
  refusing it would fail a healthy producer - older clients treat
  UNKNOWN_PRODUCER_ID as fatal or reset their sequences.  The price is that a
  duplicate or a gap arriving after the state expired is not detected; with
  state that survives restarts and segment deletion (below) that only happens
  after a day of silence from the producer.
* **evicted producer** (``max_producers``, below), **same epoch, any
  sequence: UNKNOWN_PRODUCER_ID.**  Its state was dropped while it may still
  be producing, so a retry (even of its first batch) could be appended twice;
  the error tells the client its state is gone, and clients since KIP-360
  (librdkafka 1.4+, Java 2.5+, kafka-python 2.1+) answer it by bumping the
  epoch (or taking a new producer id), which is a new instance and accepted.

``check`` is pure; ``check_all`` checks the batches of one request in order,
each against the state as if the earlier ones had been appended; ``update``
records an appended batch.

**Layout.**  One row per producer in a numpy structured array (54 bytes: the
producer id, epoch, last update and the last batch), found through an
open-addressing hash table of row numbers (linear probing, 4 bytes a slot, at
most 60 % full); the older batches of the producers inside the retry window
live in a small ordered dict.  A million producers are about 70 MB and no
Python object each: the garbage collector never walks them, and expiry,
eviction, snapshots and loading are vector operations over the arrays.

**Expiry** (``expire``) drops producers with no append for
``producer.id.expiration.ms``; a check that drops nothing costs one comparison
(the oldest update time is kept), and the scan can be done a slot range at a
time (``start``/``stop``) so a caller can bound its pauses.

**Cap** (``max_producers``).  When a new producer would exceed it, the least
recently updated 1 % are evicted at once (Redpanda also evicts the least
recently used; Kafka has no cap).  Evicted producer IDs are remembered in two
rotating Bloom filters (each as large as the cap, false-positive rate 0.1 %)
so that they get UNKNOWN_PRODUCER_ID as above; a false positive costs an
unknown producer one epoch bump, never a duplicate.

**Snapshots.**  ``snapshot(offset)`` copies the state as it is once the log
holds every offset below ``offset`` (the one step that needs the caller's
lock: a copy of the rows); ``ProducerSnapshot.encode`` and ``write`` then run
without it.  The file is a sealed file (``storage.files.seal``: magic, length,
msgpack body with the rows as raw little-endian bytes, crc32), replaced
atomically (``storage.files.atomic_write``).  A damaged file is refused with
``CorruptFileError``; format-1 files (one msgpack list per producer) and
format-2 files (no transactions) are still read.  ``recover`` loads the newest
snapshot at offset X and replays only the batch headers from X to the log end.

**Transactions** (KIP-98, the partition's side).  A transactional batch starts
its producer's transaction here at its first offset unless one is ongoing;
``end_transaction`` (an end marker the partition wrote, or read back at
recovery) ends it, and an aborted one goes into the ``AbortedIndex``.
``check_txn`` refuses a non-transactional batch from a producer with a
transaction ongoing (INVALID_TXN_STATE); ``check_marker`` decides whether a
marker is written (an older epoch is INVALID_PRODUCER_EPOCH; with no
transaction ongoing nothing is written, unless the marker bumps a known
producer's epoch, which must reach the log to survive a crash).  A marker of a
newer epoch makes it the producer's epoch with no batch (the next must start
at sequence 0; the older epoch is fenced): the row then holds the marker's
offset as ``foff``/``loff`` and no sequence (-1), so a replay skips what the
row holds as for a batch.  A marker of the producer's own epoch leaves its
batches, so retries of them are still duplicates.  Ongoing transactions are
kept in first-offset order (a dict: the oldest gives the last stable offset in
O(1)); producers with one are neither expired nor evicted.  Snapshot format 3
adds the ongoing transactions (a msgpack list of ``[pid, epoch, first
offset]`` in first-offset order) and the aborted ones (``ABORTED`` rows as raw
bytes, in marker order), both as of the snapshot's ``end`` (the log end when
the copy finished, taken under the lock in one step).  Rows copied chunk by
chunk may be older than that, so recovery replays rows from the snapshot's
offset with the rule above, and the transactions only from ``end``: nothing is
counted twice, nothing missed.  Aborted transactions whose marker lies below
the log start are dropped (retention bounds the index).  The coordinator epoch
of a marker is written in it, not checked: no per-producer coordinator epoch
is kept (Kafka fences an older one with TRANSACTION_COORDINATOR_FENCED).

Expiry uses the broker's wall clock at append time, not the client-supplied
batch timestamps.  Batches replayed from the log at recovery count as updated
at recovery time: a producer is then kept a little longer, never dropped
early.
"""
from __future__ import annotations

import collections
import enum
import logging
import math
import os
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from rbloom import Bloom

from storage.disk import CorruptFileError
from storage.files import atomic_write, fsync_dir, seal, unseal
from wire.errors import Errors

from .recordbatch import (
    CONTROL_ABORT,
    CONTROL_BIT,
    CONTROL_COMMIT,
    INT32_MAX,
    NO_SEQUENCE,
    TRANSACTIONAL_BIT,
    BatchError,
    BatchHeader,
    control_record_type,
    increment_sequence,
)

log = logging.getLogger(__name__)

MAX_CACHED_BATCHES = 5
DEFAULT_PRODUCER_ID_EXPIRATION_MS = 24 * 60 * 60 * 1000  # Kafka's producer.id.expiration.ms
DEFAULT_RETRY_WINDOW_MS = 5 * 60 * 1000  # above the clients' delivery.timeout.ms (2 min by default)
INT16_MAX = 2**15 - 1
INT64_MAX = 2**63 - 1

SNAPSHOT_MAGIC = b"PQPSTA\x00\x01"  # the layout of the sealed file; the body's "format" says what is inside
SNAPSHOT_FORMAT = 3  # 3: with the transactions (ongoing, aborted); 1 and 2 are still read
SNAPSHOT_SUFFIX = ".snapshot"
_SNAPSHOT_RE = re.compile(r"^(\d{20})\.snapshot$")

# One row per producer.  A producer with no batch (possible in format-1 files only) has every batch
# field at -1.
ROW = np.dtype([("pid", "<i8"), ("upd", "<i8"), ("foff", "<i8"), ("loff", "<i8"), ("mts", "<i8"),
                ("fseq", "<i4"), ("lseq", "<i4"), ("tpos", "<i4"), ("epoch", "<i2")])
_EMPTY, _TOMB = 0, -1  # hash table values; a live slot holds row + 1
_HASH_MUL = 0x9E3779B97F4A7C15  # Fibonacci hashing: producer ids come in runs, this spreads them
_M64 = 2**64 - 1
_MIN_BITS = 7
_MIN_ROWS = 64
_MAX_LOAD = 0.6  # live + tombstones over table slots before a rebuild
_OLDER = struct.Struct("<iiqqq")  # an older batch: first/last sequence, first/last offset, max timestamp
_EVICT_FRACTION = 0.01
_SHRINK_BELOW = 32  # rebuild smaller once fewer than 1/32 of the rows are live
_EVICTED_FPP = 0.001
# One aborted transaction: the offset of its abort marker, its first offset, the producer, and the last
# stable offset just after the marker (what ``AbortedIndex.collect`` stops on, as Kafka's
# TransactionIndex does).
ABORTED = np.dtype([("last", "<i8"), ("first", "<i8"), ("pid", "<i8"), ("lso", "<i8")])
_ABORTED_SCAN = 64  # first chunk of a collect's scan past the fetch offset (then doubled)


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    max_timestamp: int


@dataclass(slots=True)
class ProducerEntry:
    """One producer's state as plain objects (what ``get``/``producers`` return; the manager keeps rows)."""
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


def _hash(pid: int, bits: int) -> int:
    return ((pid * _HASH_MUL) & _M64) >> (64 - bits)


def _evicted_hash(key: int) -> int:
    """rbloom's hash for evicted keys (a saved filter needs a hash of its own, not Python's)."""
    return ((key * _HASH_MUL) & _M64) - 2**63


def _evicted_key(pid: int, epoch: int) -> int:
    """One evicted producer instance: its id and epoch (a bumped epoch is a new instance)."""
    return (pid << 16) | epoch


def _evicted_keys(pids: np.ndarray, epochs: np.ndarray) -> np.ndarray:
    return (pids.astype(np.uint64) << np.uint64(16)) | epochs.astype(np.uint64)


def _hash_all(pids: np.ndarray, bits: int) -> np.ndarray:
    return ((pids.astype(np.uint64) * np.uint64(_HASH_MUL)) >> np.uint64(64 - bits)).astype(np.int64)


def _place(rows: np.ndarray, n: int, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """A linear-probing table of rows ``0..n-1`` (value row + 1) and the rows left to place by probing.

    As if the rows were inserted in order of their home slot: with c[s] rows at home s, the rows
    that overflow slot s into s+1 are o[s] = max(0, o[s-1] + c[s] - 1), a Lindley recursion, whose
    closed form is W[s] - min(0, min W[..s]) with W the running sum of c - 1.  The rows at home s
    then take slots s + o[s-1], s + o[s-1] + 1, ... (their order among themselves does not matter).
    Rows that would run past the last slot are returned, to be placed by wrapping probes.  Sets
    ``rows["tpos"]``.
    """
    size = 1 << bits
    table = np.zeros(size, np.int32)
    if n == 0:
        return table, np.empty(0, np.int64)
    home = _hash_all(rows["pid"][:n], bits)
    w = np.bincount(home, minlength=size).astype(np.int32)
    w -= 1
    np.cumsum(w, out=w)
    low = np.minimum.accumulate(w)
    np.minimum(low, 0, out=low)
    w -= low  # o[s]
    first = w  # first slot of the rows at home s: s + o[s-1]
    first[1:] = first[:-1]
    first[0] = 0
    first += np.arange(size, dtype=np.int32)
    del low
    # rank of each row among the rows of its home: one round per rank (homes hold a few rows at most)
    pos = first[home].astype(np.int64)
    del first
    todo = np.arange(n, dtype=np.int64)
    claim = np.full(size, -1, np.int32)
    r = 0
    while todo.size:
        h = home[todo]
        claim[h] = todo
        won = claim[h] == todo
        pos[todo[~won]] += 1
        todo = todo[~won]
        r += 1
    inside = pos < size
    rows_in = np.flatnonzero(inside)
    table[pos[inside]] = (rows_in + 1).astype(np.int32)
    rows["tpos"][rows_in] = pos[inside]
    return table, np.flatnonzero(~inside)


def _bits_for(live: int) -> int:
    """Table size (log2) for ``live`` producers: at most half full after a rebuild."""
    return max(_MIN_BITS, math.ceil(math.log2(max(1, 2 * live + 1))))


class _Evicted:
    """Producer ids evicted by the cap: two rotating Bloom filters of ``capacity`` ids each."""

    def __init__(self, capacity: int):
        self.capacity = max(1024, capacity)
        self.current = Bloom(self.capacity, _EVICTED_FPP, _evicted_hash)
        self.previous: Bloom | None = None
        self.count = 0

    def add_all(self, keys: np.ndarray) -> None:
        for pid in keys.tolist():
            if self.count >= self.capacity:
                self.previous, self.current, self.count = self.current, Bloom(self.capacity, _EVICTED_FPP, _evicted_hash), 0
            self.current.add(pid)
            self.count += 1

    def __contains__(self, key: int) -> bool:
        return key in self.current or (self.previous is not None and key in self.previous)

    def dump(self) -> dict:
        return {"capacity": self.capacity, "count": self.count, "current": self.current.save_bytes(),
                "previous": self.previous.save_bytes() if self.previous is not None else None}

    @classmethod
    def load(cls, path: str, obj: Any) -> "_Evicted":
        try:
            e = cls(int(obj["capacity"]))
            e.count = int(obj["count"])
            e.current = Bloom.load_bytes(obj["current"], _evicted_hash)
            e.previous = Bloom.load_bytes(obj["previous"], _evicted_hash) if obj["previous"] is not None else None
        except (KeyError, TypeError, ValueError) as err:
            raise CorruptFileError(path, f"bad evicted-producer filter: {err}") from None
        return e


class AbortedIndex:
    """The aborted transactions of a partition, in marker order, as one growing array (32 B each, no
    Python object per entry).

    What read_committed Fetch answers with: ``collect(start, end)`` gives every transaction aborted
    with an offset in [start, end).  A bisect finds the first entry whose marker is at or after
    ``start``; the scan from there stops after the first entry whose ``lso`` (the last stable offset
    just after its marker) is at or beyond ``end``: every later entry began at or after that LSO (it
    was either ongoing then, so not below the LSO, or began after the marker), so none overlaps.  A
    scan therefore reads the answer plus the aborts made while a transaction spanning ``end`` was
    open, which the coordinator's transaction timeout bounds - Kafka's own bound
    (``TransactionIndex.collectAbortedTxns``).  Entries whose marker is below the log start go
    (``truncate_before``), so the index is bounded by retention.
    """

    def __init__(self, entries: np.ndarray | None = None):
        n = 0 if entries is None else len(entries)
        self._a = np.empty(max(16, n), ABORTED)
        if n:
            self._a[:n] = entries
        self._lo, self._n = 0, n

    def __len__(self) -> int:
        return self._n - self._lo

    def entries(self) -> np.ndarray:
        """A view of the entries, in marker order."""
        return self._a[self._lo:self._n]

    def add(self, pid: int, first: int, last: int, lso: int) -> bool:
        """Record producer ``pid``'s transaction from ``first`` aborted by the marker at ``last``; False
        if it is already held (same producer and first offset)."""
        a = self.entries()
        if len(a) and int(a["last"][-1]) >= last:  # not after the newest marker: only a replay does this
            if ((a["pid"] == pid) & (a["first"] == first)).any():
                return False
            self._append((0, 0, 0, 0))
            at = self._lo + int(np.searchsorted(self._a["last"][self._lo:self._n - 1], last, "right"))
            self._a[at + 1:self._n] = self._a[at:self._n - 1].copy()
            self._a[at] = (last, first, pid, lso)
            return True
        self._append((last, first, pid, lso))
        return True

    def _append(self, entry: tuple[int, int, int, int]) -> None:
        if self._n == len(self._a):
            live = self._n - self._lo
            a = np.empty(max(16, 2 * live) if live * 2 > len(self._a) else len(self._a), ABORTED)
            a[:live] = self._a[self._lo:self._n]
            self._a, self._lo, self._n = a, 0, live
        self._a[self._n] = entry
        self._n += 1

    def truncate_before(self, offset: int) -> int:
        """Drop the transactions whose marker is below ``offset`` (the log start); return how many went."""
        a = self.entries()
        k = int(np.searchsorted(a["last"], offset))
        self._lo += k
        if self._lo == self._n:
            self._lo = self._n = 0
        return k

    def collect(self, start: int, end: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of every aborted transaction overlapping [start, end) - marker at or
        after ``start``, first offset before ``end`` - by first offset (see the class doc)."""
        a = self.entries()
        if end <= start or not len(a):
            return []
        k = int(np.searchsorted(a["last"], start))
        stop, i, step = len(a), k, _ABORTED_SCAN
        lso = a["lso"]
        while i < len(a):
            j = min(i + step, len(a))
            hit = np.flatnonzero(lso[i:j] >= end)
            if hit.size:
                stop = i + int(hit[0]) + 1
                break
            i, step = j, 2 * step
        sel = a[k:stop]
        sel = sel[sel["first"] < end]
        sel = sel[np.argsort(sel["first"], kind="stable")]
        return list(zip(sel["pid"].tolist(), sel["first"].tolist()))


@dataclass
class SnapshotCopy:
    """A snapshot being copied a chunk at a time (``ProducerStateManager.snapshot_begin``)."""
    offset: int
    generation: int
    rows: np.ndarray
    done: int = 0
    restarts: int = 0


@dataclass(frozen=True)
class ProducerSnapshot:
    """A copy of the state at ``offset``, taken under the partition's lock; encoded and written without it."""
    offset: int
    rows: np.ndarray  # live rows only after ``encode``; may hold free rows (upd == INT64_MAX) before
    older: list  # [[pid, [[first_seq, last_seq, first_offset, last_offset, max_ts], ...]], ...]
    evicted: dict | None
    end: int = -1  # the log end when the copy finished: every batch held is below it (-1: ``offset``)
    # The transactions as of ``end`` exactly (copied at the finish, in one step): [[pid, epoch, first
    # offset], ...] by first offset, and the aborted ones (``ABORTED``, in marker order).
    ongoing: list = field(default_factory=list)
    aborted: np.ndarray = field(default_factory=lambda: np.empty(0, ABORTED))

    def encode(self) -> bytes:
        rows = self.rows
        free = rows["upd"] == INT64_MAX
        if free.any():
            rows = rows[~free]
        # Sorted by producer id (a load checks uniqueness in one pass).  A copy made chunk by chunk may
        # hold a producer twice (dropped after its row was copied, back in a row copied later): the row
        # with the later last batch is the newer state.
        rows = rows[np.lexsort((rows["foff"], rows["pid"]))]
        if len(rows) > 1:
            pids = rows["pid"]
            last_of_id = np.ones(len(rows), bool)
            last_of_id[:-1] = pids[1:] != pids[:-1]
            if not last_of_id.all():
                rows = rows[last_of_id]
        rows["tpos"] = 0
        older = self.older
        if older:  # a producer that took a row after that row was copied: the replay brings it back whole
            pids = rows["pid"]
            want = np.array([pid for pid, _ in older], np.int64)
            at = np.minimum(np.searchsorted(pids, want), max(len(pids) - 1, 0))
            has = (pids[at] == want) if len(pids) else np.zeros(len(want), bool)
            if not has.all():
                older = [item for item, ok in zip(older, has.tolist()) if ok]
        aborted = np.ascontiguousarray(self.aborted, ABORTED)
        return seal(SNAPSHOT_MAGIC, {"format": SNAPSHOT_FORMAT, "offset": self.offset,
                                     "end": max(self.end, self.offset), "count": len(rows),
                                     "row": ROW.descr.__repr__(), "rows": memoryview(rows.view(np.uint8)),
                                     "older": older, "evicted": self.evicted, "ongoing": self.ongoing,
                                     "aborted_row": ABORTED.descr.__repr__(), "aborted_count": len(aborted),
                                     "aborted": memoryview(aborted.view(np.uint8))})

    def write(self, path: str) -> int:
        data = self.encode()
        atomic_write(path, data)
        return len(data)


class ProducerStateManager:
    """Producer state of one partition.  Not thread-safe (the partition serialises calls)."""

    def __init__(self, *, retry_window_ms: int = DEFAULT_RETRY_WINDOW_MS, max_producers: int | None = None):
        if max_producers is not None and max_producers < 1:
            raise ValueError("max_producers must be at least 1")
        self.retry_window_ms = retry_window_ms
        self.max_producers = max_producers
        self._rows = np.zeros(_MIN_ROWS, ROW)
        self._rows["upd"] = INT64_MAX
        self._hi = 0  # rows below are live or free
        self._free = np.empty(_MIN_ROWS, np.int64)  # stack of free rows below _hi
        self._nfree = 0
        self._bits = _MIN_BITS
        self._table = np.zeros(1 << self._bits, np.int32)
        self._live = 0
        self._tombs = 0
        self._min_upd = INT64_MAX  # no live producer was updated before this
        # pid -> its older batches, packed (_OLDER each, oldest first), in update order
        self._older: collections.OrderedDict[int, bytes] = collections.OrderedDict()
        self._evicted: _Evicted | None = None
        self.evictions = 0
        self.recovery_stats: dict[str, int] = {}
        self._generation = 0
        self.shrink_due = False
        self._pass_min = INT64_MAX  # oldest update seen by the expiry pass under way
        self._pass_generation = 0
        self.snapshot_end = -1  # of the snapshot loaded: every batch it held is below this offset
        # Transactions.  pid -> (epoch, first offset) of its ongoing transaction on this partition; in
        # first-offset order (a new one always starts at the log end), so the first is the LSO's.
        self._ongoing: dict[int, tuple[int, int]] = {}
        self._aborted = AbortedIndex()
        # The transactions are exact as of this offset (the loaded snapshot's end): replay changes them
        # only for batches at or after it (rows have their own rule, ``replay``).
        self._txn_from = -1
        self._bind()

    def _bind(self) -> None:
        self._pidcol = self._rows["pid"]

    # ------------------------------------------------------------ the table
    def _find(self, pid: int) -> int:
        """The row of ``pid``, or -1."""
        table, mask, pids = self._table, (1 << self._bits) - 1, self._pidcol
        i = _hash(pid, self._bits)
        while True:
            v = table.item(i)
            if v == _EMPTY:
                return -1
            if v > 0 and pids.item(v - 1) == pid:
                return v - 1
            i = (i + 1) & mask

    def _insert(self, pid: int) -> int:
        """A row for new producer ``pid`` (not present), linked into the table."""
        if (self._live + self._tombs + 1) > _MAX_LOAD * (1 << self._bits):
            self._rebuild(_bits_for(self._live + 1))
        if self._nfree:
            self._nfree -= 1
            row = int(self._free[self._nfree])
        else:
            if self._hi == len(self._rows):
                self._grow_rows(2 * len(self._rows))
            row = self._hi
            self._hi += 1
        table, mask = self._table, (1 << self._bits) - 1
        i = _hash(pid, self._bits)
        while table.item(i) > 0:
            i = (i + 1) & mask
        if table.item(i) == _TOMB:
            self._tombs -= 1
        table[i] = row + 1
        self._rows[row] = (pid, 0, -1, -1, -1, -1, -1, i, 0)
        self._live += 1
        return row

    def _grow_rows(self, n: int) -> None:
        rows = np.zeros(n, ROW)
        rows["upd"] = INT64_MAX
        rows[:self._hi] = self._rows[:self._hi]
        self._rows = rows
        self._bind()

    def _rebuild(self, bits: int) -> None:
        """Compact the rows (live ones first, in row order) and rebuild the table with 2**bits slots."""
        live = self._rows[:self._hi]
        self._install(live[live["upd"] != INT64_MAX], bits)

    def _install(self, live: np.ndarray, bits: int) -> None:
        """Take ``live`` (rows of distinct producers) as the whole state, with a table of 2**bits slots."""
        n = len(live)
        rows = np.empty(max(_MIN_ROWS, 1 << max(0, (n - 1).bit_length())), ROW)
        rows[:n] = live
        rows[n:] = np.zeros(1, ROW)
        rows["upd"][n:] = INT64_MAX
        table, spilled = _place(rows, n, bits)
        self._rows, self._table, self._bits = rows, table, bits
        self._generation += 1  # rows renumbered: a snapshot being copied chunk by chunk starts over
        self._hi, self._nfree, self._live, self._tombs = n, 0, n, 0
        if len(self._free) > 4 * _MIN_ROWS:
            self._free = np.empty(_MIN_ROWS, np.int64)
        self._bind()
        mask = (1 << bits) - 1
        for row in spilled.tolist():  # the few that run past the table's end wrap to its start
            i = _hash(self._pidcol.item(row), bits)
            while table.item(i) != _EMPTY:
                i = (i + 1) & mask
            table[i] = row + 1
            rows["tpos"][row] = i

    def _remove_rows(self, rows_: np.ndarray) -> None:
        """Drop the producers in rows ``rows_`` (distinct live rows)."""
        if rows_.size == 0:
            return
        rows = self._rows
        if self._older:
            gone = rows["pid"][rows_]
            keys = np.fromiter(self._older.keys(), np.int64, len(self._older))
            for pid in keys[np.isin(keys, gone)].tolist():
                del self._older[pid]
        self._table[rows["tpos"][rows_]] = _TOMB
        rows["upd"][rows_] = INT64_MAX
        rows["pid"][rows_] = -1
        need = self._nfree + rows_.size
        if need > len(self._free):
            free = np.empty(max(need, 2 * len(self._free)), np.int64)
            free[:self._nfree] = self._free[:self._nfree]
            self._free = free
        self._free[self._nfree:need] = rows_
        self._nfree = need
        self._live -= rows_.size
        self._tombs += rows_.size  # _min_upd stays a lower bound
        # Give the memory back (``compact``) once few producers are left: the rebuild scans the rows
        # and places those left, a few milliseconds for a million rows with 32k left.
        self.shrink_due = self._hi > 4 * _MIN_ROWS and self._live < self._hi // _SHRINK_BELOW

    def compact(self) -> bool:
        """Rebuild smaller if expiry or eviction left few rows live (``shrink_due``); True if it did."""
        if not self.shrink_due:
            return False
        self.shrink_due = False
        self._rebuild(_bits_for(self._live))
        return True

    # ------------------------------------------------------------ reading one producer
    def _entry(self, pid: int) -> ProducerEntry | None:
        row = self._find(pid)
        if row < 0:
            return None
        _, upd, foff, loff, mts, fseq, lseq, _, epoch = self._rows[row].item()
        batches = [BatchMetadata(*b) for b in _OLDER.iter_unpack(self._older.get(pid, b""))]
        if fseq != -1 or lseq != -1:
            batches.append(BatchMetadata(fseq, lseq, foff, loff, mts))
        return ProducerEntry(pid, epoch, batches, upd)

    # ------------------------------------------------------------ checking
    def _decide(self, entry: ProducerEntry | None, h: BatchHeader) -> Decision:
        if not h.has_producer_id:
            return APPEND
        pid, epoch, seq = h.producer_id, h.producer_epoch, h.base_sequence
        if entry is None:
            if self._evicted is not None and _evicted_key(pid, epoch) in self._evicted:
                return _error(Errors.UNKNOWN_PRODUCER_ID,
                              f"producer {pid} epoch {epoch}: its state was evicted (more than {self.max_producers} "
                              f"producers in this partition); start a new epoch")
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
        return self._decide(self._entry(h.producer_id) if h.has_producer_id else None, h)

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
            if not h.has_producer_id:
                entry = None
            elif pid in overlay:
                entry = overlay[pid]
            else:
                entry = self._entry(pid)
            d = self._decide(entry, h)
            if d.action is Action.APPEND:
                if h.has_producer_id:
                    overlay[pid] = _apply(entry, h, offset if offset is not None else -1, 0)
                if offset is not None:
                    offset += h.last_offset_delta + 1
            out.append(d)
        return out

    # ------------------------------------------------------------ updating
    def update(self, h: BatchHeader, first_offset: int, now_ms: int, *, txn: bool = True) -> None:
        """Record that batch ``h`` was appended at ``first_offset`` (no-op without a producer ID); a
        transactional batch starts its producer's transaction here unless one is ongoing (not with
        ``txn=False``: the row only)."""
        if not h.has_producer_id:
            return
        pid = h.producer_id
        row = self._find(pid)
        if row < 0:
            row = self._new_row(pid)
            same_epoch = False
        else:
            same_epoch = self._rows["epoch"].item(row) == h.producer_epoch
        r = self._rows[row]
        if same_epoch and r["fseq"] != -1 and now_ms - int(r["upd"]) < self.retry_window_ms:
            prev = (int(r["fseq"]), int(r["lseq"]), int(r["foff"]), int(r["loff"]), int(r["mts"]))
            kept = self._older.pop(pid, b"")
            packed = _OLDER.pack(*prev)
            each = [kept[i:i + _OLDER.size] for i in range(0, len(kept), _OLDER.size)]
            if packed in each:  # already there (a replay after a snapshot copied chunk by chunk)
                kept = b"".join(x for x in each if x != packed)
            # re-inserted: the dict stays in update order
            self._older[pid] = kept[-(MAX_CACHED_BATCHES - 2) * _OLDER.size:] + packed
        elif pid in self._older:
            del self._older[pid]
        last_offset = first_offset + h.last_offset_delta if first_offset >= 0 else -1
        self._rows[row] = (pid, now_ms, first_offset, last_offset, h.max_timestamp, h.base_sequence,
                           h.last_sequence, r["tpos"], h.producer_epoch)
        if now_ms < self._min_upd:
            self._min_upd = now_ms
        if now_ms < self._pass_min:
            self._pass_min = now_ms
        self._trim_older(now_ms)
        if txn and h.attributes & TRANSACTIONAL_BIT:
            self._begin_txn(pid, h.producer_epoch, first_offset)

    def _new_row(self, pid: int) -> int:
        if self.max_producers is not None and self._live >= self.max_producers:
            self._evict(max(1, int(self.max_producers * _EVICT_FRACTION)))
        return self._insert(pid)

    def _updated(self, now_ms: int) -> None:
        if now_ms < self._min_upd:
            self._min_upd = now_ms
        if now_ms < self._pass_min:
            self._pass_min = now_ms

    def replay(self, h: BatchHeader, first_offset: int, now_ms: int) -> None:
        """``update`` for a data batch read back from the log at recovery: the row is skipped if it already
        holds that batch or a later one (a snapshot copied chunk by chunk; see ``snapshot_begin``), the
        transaction if it is below the offset the loaded transactions are exact at."""
        if not h.has_producer_id:
            return
        row = self._find(h.producer_id)
        if row < 0 or self._rows["foff"].item(row) < first_offset:
            self.update(h, first_offset, now_ms, txn=False)
        if h.attributes & TRANSACTIONAL_BIT and first_offset >= self._txn_from:
            self._begin_txn(h.producer_id, h.producer_epoch, first_offset)

    # ------------------------------------------------------------ transactions
    def _begin_txn(self, pid: int, epoch: int, first_offset: int) -> None:
        txn = self._ongoing.get(pid)
        if txn is None:
            self._ongoing[pid] = (epoch, first_offset)  # at the end: the newest first offset
        elif epoch > txn[0]:
            self._ongoing[pid] = (epoch, txn[1])  # Kafka keeps the transaction across an epoch bump

    @property
    def has_ongoing(self) -> bool:
        return bool(self._ongoing)

    def check_txn(self, headers: Sequence[BatchHeader], decisions: Sequence[Decision]) -> Decision | None:
        """INVALID_TXN_STATE if a batch to be appended is not transactional while its producer has a
        transaction ongoing here (or started by an earlier batch of the request), as Kafka's
        ``ProducerAppendInfo.appendDataBatch``; None if all may go."""
        ongoing = self._ongoing
        started: set[int] = set()
        for h, d in zip(headers, decisions):
            if d.action is not Action.APPEND or not h.has_producer_id:
                continue
            pid = h.producer_id
            if h.attributes & TRANSACTIONAL_BIT:
                started.add(pid)
            elif pid in ongoing or pid in started:
                first = ongoing[pid][1] if pid in ongoing else "this request"
                return _error(Errors.INVALID_TXN_STATE,
                              f"producer {pid}: non-transactional batch while its transaction (from offset "
                              f"{first}) is ongoing on this partition")
        return None

    def check_marker(self, pid: int, epoch: int) -> Decision:
        """What to do with an end-of-transaction marker of producer ``pid`` at ``epoch``: APPEND (write it),
        DUPLICATE (nothing to write: no transaction is ongoing here and the epoch changes nothing), or
        INVALID_PRODUCER_EPOCH if ``epoch`` is older than the producer's."""
        row = self._find(pid)
        txn = self._ongoing.get(pid)
        current = self._rows["epoch"].item(row) if row >= 0 else -1
        if txn is not None:
            current = max(current, txn[0])
        if epoch < current:
            return _error(Errors.INVALID_PRODUCER_EPOCH,
                          f"producer {pid}: marker epoch {epoch} is older than the current epoch {current}")
        if txn is not None:
            return APPEND
        if row >= 0 and epoch > current:
            return APPEND  # no transaction, but the epoch bump must reach the log to outlive a restart
        return Decision(Action.DUPLICATE, message=f"producer {pid}: no transaction ongoing on this partition")

    def end_transaction(self, pid: int, epoch: int, commit: bool, offset: int, now_ms: int,
                        timestamp_ms: int = -1) -> None:
        """Record the marker of producer ``pid`` written (or read back at recovery) at ``offset``.

        The row takes a newer epoch (``foff``/``loff`` = ``offset``, no batch: the next batch must start
        at sequence 0, and a replay skips what precedes the marker); a marker of the producer's epoch
        keeps its batches, so retries of them are still answered as duplicates.  The ongoing
        transaction ends; an aborted one goes into the aborted index.  Either part is skipped when the
        state already holds the marker (``replay``'s rules).
        """
        row = self._find(pid)
        if row < 0 or self._rows["foff"].item(row) < offset:
            if row < 0 or epoch > self._rows["epoch"].item(row):
                if row < 0:
                    row = self._new_row(pid)
                elif pid in self._older:
                    del self._older[pid]
                self._rows[row] = (pid, now_ms, offset, offset, timestamp_ms, NO_SEQUENCE, NO_SEQUENCE,
                                   self._rows["tpos"].item(row), epoch)
            else:
                self._rows["upd"][row] = now_ms
            self._updated(now_ms)
        if offset < self._txn_from:
            return
        txn = self._ongoing.pop(pid, None)
        if txn is not None and not commit:
            lso = next(iter(self._ongoing.values()))[1] if self._ongoing else offset + 1
            self._aborted.add(pid, txn[1], offset, lso)

    def first_unstable_offset(self) -> int | None:
        """The first offset of the oldest ongoing transaction (the LSO's bound), None if none is ongoing."""
        for _, first in self._ongoing.values():
            return first
        return None

    def ongoing_ids(self) -> Any:
        """The producer ids with a transaction ongoing here (a live view, for membership tests)."""
        return self._ongoing.keys()

    def ongoing(self) -> dict[int, tuple[int, int]]:
        """{producer id: (epoch, first offset)} of the ongoing transactions."""
        return dict(self._ongoing)

    def aborted_transactions(self, start: int, end: int) -> list[tuple[int, int]]:
        """``AbortedIndex.collect``."""
        return self._aborted.collect(start, end)

    def truncate_before(self, log_start_offset: int) -> int:
        """The log start moved up: forget aborted transactions whose marker is gone with it."""
        return self._aborted.truncate_before(log_start_offset)

    def _trim_older(self, now_ms: int) -> None:
        """Drop the older batches of producers idle for the retry window (oldest update first)."""
        older = self._older
        while older:
            pid = next(iter(older))
            row = self._find(pid)
            if row >= 0 and now_ms - self._rows["upd"].item(row) < self.retry_window_ms:
                return
            del older[pid]

    def _evict(self, n: int) -> None:
        """Drop the ``n`` least recently updated producers (the cap), remembering their ids.  Producers with
        a transaction ongoing are kept (their state decides what read_committed consumers see)."""
        upd = self._rows["upd"][:self._hi]
        kept_min = INT64_MAX
        if self._ongoing:
            held = self._ongoing_rows()
            if held.size:
                kept_min = int(upd[held].min())
                upd = upd.copy()
                upd[held] = INT64_MAX  # as if free: never picked
        n = min(n, self._live)
        rows_ = np.argpartition(upd, n - 1)[:n] if n < len(upd) else np.arange(len(upd))
        rows_ = rows_[upd[rows_] != INT64_MAX]
        evicted_before = min(int(upd[rows_].max()) if rows_.size else INT64_MAX, kept_min)
        if self._evicted is None:
            self._evicted = _Evicted(self.max_producers or 0)
        self._evicted.add_all(_evicted_keys(self._rows["pid"][rows_], self._rows["epoch"][rows_]))
        self.evictions += int(rows_.size)
        log.info("producer state: %d producers, the cap is %s; evicted the %d least recently used",
                 self._live, self.max_producers, rows_.size)
        self._remove_rows(rows_)
        self._min_upd = max(self._min_upd, evicted_before)  # the rest were updated no earlier

    def _ongoing_rows(self) -> np.ndarray:
        rows_ = [self._find(pid) for pid in self._ongoing]
        return np.array([r for r in rows_ if r >= 0], np.int64)

    def expire(self, now_ms: int, producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
               start: int = 0, stop: int | None = None) -> int:
        """Forget producers with no append for ``producer_id_expiration_ms`` or more, among rows
        ``start``..``stop`` (all by default); return how many went.  Costs one comparison when none is due."""
        self._trim_older(now_ms)
        cutoff = now_ms - producer_id_expiration_ms
        if self._min_upd > cutoff:
            return 0
        whole = start == 0 and stop is None
        stop = self._hi if stop is None else min(stop, self._hi)
        if start == 0:
            self._pass_min, self._pass_generation = INT64_MAX, self._generation
        if start >= stop:
            return 0
        last = stop == self._hi
        upd = self._rows["upd"]
        doomed = np.flatnonzero(upd[start:stop] <= cutoff) + start
        if self._ongoing and doomed.size:  # a producer with a transaction ongoing is kept (as Kafka does)
            doomed = doomed[~np.isin(self._rows["pid"][doomed], np.fromiter(self._ongoing, np.int64))]
        n = int(doomed.size)
        if n:
            self._remove_rows(doomed)
        # The oldest update left in this range (freed rows hold INT64_MAX); a pass's last chunk makes the
        # oldest of the whole pass (and of every update since it began) the new lower bound.
        self._pass_min = min(self._pass_min, int(self._rows["upd"][start:stop].min()))
        if last:
            if self._pass_generation != self._generation:  # rows renumbered during the pass: look at all
                self._pass_min = int(self._rows["upd"][:self._hi].min()) if self._live else INT64_MAX
            self._min_upd = self._pass_min if self._live else INT64_MAX
        if whole:
            self.compact()
        return n

    def due_for_expiry(self, now_ms: int, producer_id_expiration_ms: int) -> bool:
        return self._min_upd <= now_ms - producer_id_expiration_ms

    @property
    def row_count(self) -> int:
        """Rows in use or free below the high mark (what ``expire``'s ``start``/``stop`` range over)."""
        return self._hi

    def producers(self) -> dict[int, ProducerEntry]:
        """A copy of the state, by producer ID (a Python object per producer: for tests and tools)."""
        live = self._rows[:self._hi]
        pids = live["pid"][live["upd"] != INT64_MAX].tolist()
        return {pid: self._entry(pid) for pid in pids}

    def describe(self, limit: int) -> list[tuple[int, int, int, int, int]]:
        """The ``limit`` lowest producer ids as (producer id, epoch, last sequence, last batch's max timestamp,
        first offset of its ongoing transaction or -1)."""
        live = self._rows[:self._hi]
        live = live[live["upd"] != INT64_MAX]
        limit = max(0, min(limit, len(live)))
        if limit == 0:
            return []
        pick = np.argpartition(live["pid"], limit - 1)[:limit] if limit < len(live) else np.arange(len(live))
        pick = pick[np.argsort(live["pid"][pick])]
        sel = live[pick]
        ongoing = self._ongoing
        return [(pid, epoch, lseq, mts, ongoing[pid][1] if pid in ongoing else -1)
                for pid, epoch, lseq, mts in zip(sel["pid"].tolist(), sel["epoch"].tolist(), sel["lseq"].tolist(),
                                                 sel["mts"].tolist())]

    def get(self, producer_id: int) -> ProducerEntry | None:
        return self._entry(producer_id)

    def __len__(self) -> int:
        return self._live

    def memory_bytes(self) -> int:
        """Bytes held by the arrays (rows, table, free list; not the older batches' small objects)."""
        return self._rows.nbytes + self._table.nbytes + self._free.nbytes

    def stats(self) -> dict[str, int]:
        return {"producers": self._live, "producers_with_older_batches": len(self._older),
                "evictions": self.evictions, "array_bytes": self.memory_bytes(),
                "ongoing_transactions": len(self._ongoing), "aborted_transactions": len(self._aborted)}

    # ------------------------------------------------------------ snapshots
    def snapshot(self, log_end_offset: int) -> ProducerSnapshot:
        """The state as of ``log_end_offset``, copied (one array copy): encode and write it without the lock."""
        c = self.snapshot_begin(log_end_offset)
        while not self.snapshot_step(c, len(c.rows)):
            pass
        return self.snapshot_finish(c)

    def snapshot_begin(self, log_end_offset: int) -> "SnapshotCopy":
        """Start a copy of the state made ``snapshot_step`` by ``snapshot_step``, each under the caller's lock
        and with appends in between, so that no append waits for a whole copy.

        The copy is labelled with ``log_end_offset``, the log end when it starts; a row copied later may
        already hold batches appended after it.  Recovery replays the log from that offset and skips a
        batch a row already holds (``replay``), so the result is the state at the log end either way.
        """
        return SnapshotCopy(log_end_offset, self._generation, np.empty(self._hi, ROW))

    def snapshot_step(self, c: "SnapshotCopy", rows: int) -> bool:
        """Copy the next ``rows`` rows; True once all are copied.  Starts over if the rows were renumbered
        since (a rebuild), which only growth past a power of two or a mass expiry does."""
        if c.generation != self._generation:
            c.generation, c.done, c.restarts = self._generation, 0, c.restarts + 1
            c.rows = np.empty(self._hi, ROW)
        stop = min(c.done + rows, len(c.rows))
        c.rows[c.done:stop] = self._rows[c.done:stop]
        c.done = stop
        return c.done >= len(c.rows)

    def snapshot_finish(self, c: "SnapshotCopy", log_end_offset: int | None = None) -> ProducerSnapshot:
        """The copy, with the older batches, evicted ids and transactions as they are now;
        ``log_end_offset``: the log end now (every batch the copy holds is below it, and the transactions
        are exactly those of the log below it: recovery replays them only from there)."""
        older = [[pid, [list(b) for b in _OLDER.iter_unpack(bs)]] for pid, bs in self._older.items()]
        ongoing = [[pid, epoch, first] for pid, (epoch, first) in self._ongoing.items()]
        return ProducerSnapshot(c.offset, c.rows, older, self._evicted.dump() if self._evicted is not None else None,
                                c.offset if log_end_offset is None else log_end_offset, ongoing,
                                self._aborted.entries().copy())

    def write_snapshot(self, path: str, log_end_offset: int) -> int:
        """Atomically write the state, valid once the log holds every offset below ``log_end_offset``.

        Returns the file size.
        """
        return self.snapshot(log_end_offset).write(path)

    def load_snapshot(self, path: str) -> int:
        """Replace the state with the snapshot in ``path``; return the offset it was taken at."""
        offset, end, rows, older, evicted, txns = _read(path)
        self.snapshot_end = end
        if txns is None:  # formats 1 and 2: no transaction was served; replay finds every one from offset
            self._ongoing, self._aborted, self._txn_from = {}, AbortedIndex(), offset
        else:
            ongoing, aborted = txns
            self._ongoing = {pid: (epoch, first) for pid, epoch, first in ongoing}
            self._aborted, self._txn_from = AbortedIndex(aborted), end
        n = len(rows)
        self._install(rows, _bits_for(n))
        self._min_upd = int(self._rows["upd"][:n].min()) if n else INT64_MAX
        self._older = collections.OrderedDict()
        for pid, batches in sorted(older, key=lambda item: self._rows["upd"].item(self._find(item[0]))):
            self._older[pid] = b"".join(_OLDER.pack(*b) for b in batches)
        self._evicted = evicted
        return offset

    # ------------------------------------------------------------ recovery
    @classmethod
    def recover(cls, directory: str, log_: Any, now_ms: int, **options: Any) -> "ProducerStateManager":
        """Load the newest snapshot in ``directory`` and replay the log's batch headers after it.

        ``log_`` is a ``broker.log.PartitionLog`` (anything with
        ``directory``, ``log_start_offset``, ``log_end_offset``, ``iter_headers``
        and ``read``, which gives a control batch whole to learn its type).  A
        snapshot taken at an offset beyond the log end proves acknowledged
        batches are missing from the log: ``CorruptFileError``.  A damaged
        newest snapshot is refused too (delete it to fall back to the previous
        one).  ``recovery_stats`` tells what was done.  ``options`` go to the
        constructor.
        """
        mgr = cls(**options)
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
            if mgr.snapshot_end > end:
                raise CorruptFileError(path, f"producer state snapshot holds batches up to offset {mgr.snapshot_end} "
                                             f"but the log in {directory} ends at {end}: acknowledged batches are "
                                             f"missing from the log")
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
            if h.attributes & CONTROL_BIT:
                _replay_control(mgr, log_, h, now_ms)
            else:
                mgr.replay(h, h.base_offset, now_ms)
        mgr.truncate_before(start)
        mgr.recovery_stats = {"snapshot_offset": -1 if snap_offset is None else snap_offset,
                              "replayed_batches": replayed, "producers": mgr._live}
        return mgr

    def take_snapshot(self, directory: str, log_end_offset: int, keep: int = 2) -> str:
        """Write ``<offset>.snapshot`` in ``directory`` and delete all but the newest ``keep`` snapshots."""
        return install_snapshot(directory, self.snapshot(log_end_offset), keep)


def _replay_control(mgr: ProducerStateManager, log_: Any, h: BatchHeader, now_ms: int) -> None:
    """A control batch read back at recovery: an end-of-transaction marker ends its transaction (its type
    is in its record: the batch is read whole).  Only the broker writes control batches."""
    if not (h.attributes & TRANSACTIONAL_BIT and h.has_producer_id):
        return
    batch = log_.read(h.base_offset, 0)[:h.size]
    try:
        kind = control_record_type(batch)
    except BatchError as e:
        raise CorruptFileError(log_.directory, f"control batch at offset {h.base_offset}: {e}") from None
    if kind in (CONTROL_ABORT, CONTROL_COMMIT):
        mgr.end_transaction(h.producer_id, h.producer_epoch, kind == CONTROL_COMMIT, h.base_offset, now_ms,
                            h.max_timestamp)


# ---------------------------------------------------------------- snapshot files

def install_snapshot(directory: str, snap: ProducerSnapshot, keep: int = 2) -> str:
    """Write ``snap`` as ``<offset>.snapshot`` in ``directory`` (durable when this returns) and delete all
    but the newest ``keep`` snapshots.  Needs no lock on the state."""
    path = snapshot_path(directory, snap.offset)
    snap.write(path)
    old = list_snapshots(directory)[:-keep] if keep > 0 else []
    for _, p in old:
        os.unlink(p)
    if old:
        fsync_dir(directory)
    return path


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


def _check_rows(path: str, rows: np.ndarray, offset: int, markers: bool = False) -> None:
    """Refuse rows no writer of ours produces (vector checks over the whole file).  ``markers``: rows
    whose last event is an epoch-bumping marker (no sequence, ``foff == loff``: format 3) are allowed."""
    def bad(mask: np.ndarray, why: str) -> None:
        if mask.any():
            i = int(np.flatnonzero(mask)[0])
            raise CorruptFileError(path, f"producer {int(rows['pid'][i])}: {why} (row {i})")

    pids = rows["pid"]
    bad(pids < 0, "negative producer ID")
    bad(rows["epoch"] < 0, "negative epoch")
    bad(rows["upd"] == INT64_MAX, "no last update time")
    if len(pids) > 1:
        bad(np.diff(pids) <= 0, "producers out of order or listed twice")
    no_seq = (rows["fseq"] == -1) & (rows["lseq"] == -1)
    none = no_seq & (rows["foff"] == -1) & (rows["loff"] == -1)
    some = ~none
    if markers:
        marker = no_seq & (rows["foff"] >= 0) & (rows["foff"] == rows["loff"])
        bad(marker & (rows["foff"] >= offset), f"marker offset out of range (snapshot offset {offset})")
        some &= ~marker
    bad(some & ((rows["fseq"] < 0) | (rows["lseq"] < 0)), "batch sequence out of range")
    bad(some & ((rows["foff"] < 0) | (rows["foff"] > rows["loff"]) | (rows["loff"] >= offset)),
        f"batch offsets out of range (snapshot offset {offset})")


def _check_batches(path: str, pid: Any, raw_batches: Any, offset: int, most: int) -> list[tuple]:
    if not isinstance(raw_batches, list):
        raise CorruptFileError(path, f"producer {pid}: batches are not a list")
    if len(raw_batches) > most:
        raise CorruptFileError(path, f"producer {pid}: {len(raw_batches)} cached batches (at most {most})")
    out = []
    for rb in raw_batches:
        if not (isinstance(rb, list) and len(rb) == 5 and all(_int(x) for x in rb)):
            raise CorruptFileError(path, f"producer {pid}: bad batch entry {rb!r}")
        fs, ls, fo, lo, _ = rb
        if not (0 <= fs <= INT32_MAX and 0 <= ls <= INT32_MAX and 0 <= fo <= lo < offset):
            raise CorruptFileError(path, f"producer {pid}: batch {rb!r} out of range (snapshot offset {offset})")
        out.append(tuple(rb))
    return out


def _read_format1(path: str, obj: dict, offset: int) -> tuple[np.ndarray, list, None]:
    items = obj.get("producers")
    if not isinstance(items, list):
        raise CorruptFileError(path, "producers is not a list")
    rows = np.zeros(len(items), ROW)
    older = []
    seen = set()
    for k, item in enumerate(items):
        if not (isinstance(item, list) and len(item) == 4 and all(_int(x) for x in item[:3])):
            raise CorruptFileError(path, f"bad producer entry {item!r}")
        pid, epoch, last_update, raw_batches = item
        if pid < 0 or not 0 <= epoch <= INT16_MAX:
            raise CorruptFileError(path, f"producer {pid}: bad producer ID or epoch {epoch}")
        if pid in seen:
            raise CorruptFileError(path, f"producer {pid} appears twice")
        seen.add(pid)
        batches = _check_batches(path, pid, raw_batches, offset, MAX_CACHED_BATCHES)
        last = batches[-1] if batches else (-1, -1, -1, -1, -1)
        rows[k] = (pid, last_update, last[2], last[3], last[4], last[0], last[1], 0, epoch)
        if len(batches) > 1:
            older.append([pid, [list(b) for b in batches[:-1]]])
    order = np.argsort(rows["pid"], kind="stable")
    return rows[order], older, None


_Txns = tuple[list[tuple[int, int, int]], np.ndarray] | None  # ongoing [(pid, epoch, first)], aborted


def _check_txns(path: str, obj: dict, end: int) -> _Txns:
    """The transactions of a format-3 snapshot, checked: every offset below ``end`` (the log end the
    copy finished at, which recovery checks against the log), as the rows are."""
    raw_ongoing = obj.get("ongoing")
    if not isinstance(raw_ongoing, list):
        raise CorruptFileError(path, "ongoing transactions are not a list")
    ongoing = []
    seen: set[int] = set()
    prev = -1
    for item in raw_ongoing:
        if not (isinstance(item, list) and len(item) == 3 and all(_int(x) for x in item)):
            raise CorruptFileError(path, f"bad ongoing transaction {item!r}")
        pid, epoch, first = item
        if pid < 0 or not 0 <= epoch <= INT16_MAX or pid in seen:
            raise CorruptFileError(path, f"ongoing transaction {item!r}: bad or repeated producer, or bad epoch")
        if not prev < first < end:
            raise CorruptFileError(path, f"ongoing transaction {item!r}: first offset out of order or out of "
                                         f"range (snapshot end {end})")
        seen.add(pid)
        prev = first
        ongoing.append((pid, epoch, first))
    raw, count = obj.get("aborted"), obj.get("aborted_count")
    if obj.get("aborted_row") != repr(ABORTED.descr):
        raise CorruptFileError(path, f"aborted transactions of an unknown layout {obj.get('aborted_row')!r}")
    if not (isinstance(raw, bytes) and _int(count) and count >= 0 and len(raw) == count * ABORTED.itemsize):
        raise CorruptFileError(path, f"aborted transactions do not match the count {count!r}")
    aborted = np.frombuffer(raw, ABORTED)
    if len(aborted):
        last, first = aborted["last"], aborted["first"]
        wrong = ((aborted["pid"] < 0) | (first < 0) | (first >= last) | (last >= end) | (aborted["lso"] < 0)
                 | (aborted["lso"] > last + 1))
        if len(aborted) > 1:
            wrong[1:] |= np.diff(last) <= 0
        if wrong.any():
            i = int(np.flatnonzero(wrong)[0])
            raise CorruptFileError(path, f"aborted transaction {aborted[i].tolist()} out of order or out of "
                                         f"range (snapshot end {end})")
    return ongoing, aborted


def _read(path: str) -> tuple[int, int, np.ndarray, list, _Evicted | None, _Txns]:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise CorruptFileError(path, f"cannot read: {e.strerror}") from None
    return _decode(path, data)


def _decode(path: str, data: bytes) -> tuple[int, int, np.ndarray, list, _Evicted | None, _Txns]:
    """(offset, end, rows sorted by producer id, older batches, evicted filter, transactions or None
    before format 3) of a snapshot file."""
    obj = unseal(path, data, SNAPSHOT_MAGIC, "producer state snapshot")
    fmt = obj.get("format")
    if fmt not in (1, 2, SNAPSHOT_FORMAT):
        raise CorruptFileError(path, f"unsupported snapshot format {fmt!r}")
    offset = obj.get("offset")
    if not _int(offset) or offset < 0:
        raise CorruptFileError(path, f"bad offset {offset!r}")
    end = obj.get("end", offset)
    if not _int(end) or end < offset:
        raise CorruptFileError(path, f"bad end offset {end!r} (offset {offset})")
    if fmt == 1:
        rows, older, evicted = _read_format1(path, obj, offset)
    else:
        raw, count = obj.get("rows"), obj.get("count")
        if obj.get("row") != repr(ROW.descr):
            raise CorruptFileError(path, f"rows of an unknown layout {obj.get('row')!r}")
        if not (isinstance(raw, bytes) and _int(count) and count >= 0 and len(raw) == count * ROW.itemsize):
            raise CorruptFileError(path, f"rows do not match the count {count!r}")
        rows = np.frombuffer(raw, ROW)
        older = obj.get("older")
        if not isinstance(older, list):
            raise CorruptFileError(path, "older batches are not a list")
        evicted = _Evicted.load(path, obj["evicted"]) if obj.get("evicted") is not None else None
    _check_rows(path, rows, end, markers=fmt >= 3)
    txns = _check_txns(path, obj, end) if fmt >= 3 else None
    known = set()
    for item in older:
        if not (isinstance(item, list) and len(item) == 2 and _int(item[0])):
            raise CorruptFileError(path, f"bad older-batches entry {item!r}")
        pid = item[0]
        _check_batches(path, pid, item[1], end, MAX_CACHED_BATCHES - 1)
        if pid in known:
            raise CorruptFileError(path, f"producer {pid}: older batches listed twice")
        known.add(pid)
    if known:  # each has a row: rows are sorted by producer id (checked above), so a binary search each
        want = np.fromiter(known, np.int64, len(known))
        pids = rows["pid"]
        at = np.minimum(np.searchsorted(pids, want), max(len(pids) - 1, 0))
        missing = want[(pids[at] != want) if len(pids) else np.ones(len(want), bool)]
        if missing.size:
            raise CorruptFileError(path, f"older batches of producer {int(missing[0])}, which has no row")
    return offset, end, rows, older, evicted, txns


def read_snapshot(path: str) -> tuple[int, dict[int, ProducerEntry]]:
    """The snapshot in ``path`` as (offset, producers by id) (for tools and tests)."""
    m = ProducerStateManager()
    offset = m.load_snapshot(path)
    return offset, m.producers()
