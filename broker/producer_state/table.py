"""The row table: one numpy row per producer found through an open-addressing hash table, the older
batches of the producers inside the retry window, expiry, and the cap's eviction with its Bloom filters
of evicted producers.  The design: ``docs/producer-state.md``.
"""
from __future__ import annotations

import logging
import math
import struct
from typing import Any

import numpy as np
from rbloom import Bloom

from snapshots.storage.disk import CorruptFileError

# The package's name, as before it was split into modules: log configuration and readers see one
# logger.
log = logging.getLogger(__package__)

DEFAULT_PRODUCER_ID_EXPIRATION_MS = 24 * 60 * 60 * 1000  # Kafka's producer.id.expiration.ms
DEFAULT_RETRY_WINDOW_MS = 5 * 60 * 1000  # above the clients' delivery.timeout.ms (2 min by default)
INT64_MAX = 2**63 - 1

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


class _Table:
    """``ProducerStateManager``'s row table (its ``__init__`` makes the arrays these methods keep)."""

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

    def _new_row(self, pid: int) -> int:
        if self.max_producers is not None and self._live >= self.max_producers:
            self._evict(max(1, int(self.max_producers * _EVICT_FRACTION)))
        return self._insert(pid)

    def _updated(self, now_ms: int) -> None:
        if now_ms < self._min_upd:
            self._min_upd = now_ms
        if now_ms < self._pass_min:
            self._pass_min = now_ms

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

    def __len__(self) -> int:
        return self._live

    def memory_bytes(self) -> int:
        """Bytes held by the arrays (rows, table, free list; not the older batches' small objects)."""
        return self._rows.nbytes + self._table.nbytes + self._free.nbytes

    def stats(self) -> dict[str, int]:
        return {"producers": self._live, "producers_with_older_batches": len(self._older),
                "evictions": self.evictions, "array_bytes": self.memory_bytes(),
                "ongoing_transactions": len(self._ongoing), "aborted_transactions": len(self._aborted)}
