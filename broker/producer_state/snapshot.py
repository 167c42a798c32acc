"""Snapshots of the producer state: the copy (chunk by chunk under the partition's lock), the sealed
file (formats 1 to 3; 3 adds the transactions), writing and listing the files, and reading one back
with every field checked.  The design: ``docs/producer-state.md``.
"""
from __future__ import annotations

import collections
import os
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from snapshots.storage.disk import CorruptFileError
from snapshots.storage.files import atomic_write, fsync_dir, read_whole, seal, unseal

from ..recordbatch import INT32_MAX
from .rules import MAX_CACHED_BATCHES
from .table import INT64_MAX, ROW, _OLDER, _bits_for, _Evicted
from .transactions import ABORTED, AbortedIndex

INT16_MAX = 2**15 - 1

SNAPSHOT_MAGIC = b"PQPSTA\x00\x01"  # the layout of the sealed file; the body's "format" says what is inside
SNAPSHOT_FORMAT = 3  # 3: with the transactions (ongoing, aborted); 1 and 2 are still read
SNAPSHOT_SUFFIX = ".snapshot"
_SNAPSHOT_RE = re.compile(r"^(\d{20})\.snapshot$")


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


class _Snapshots:
    """``ProducerStateManager``'s snapshots: taking a copy, writing it, loading one."""

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

    def take_snapshot(self, directory: str, log_end_offset: int, keep: int = 2) -> str:
        """Write ``<offset>.snapshot`` in ``directory`` and delete all but the newest ``keep`` snapshots."""
        return install_snapshot(directory, self.snapshot(log_end_offset), keep)


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


def _array(path: str, obj: dict, key: str, dtype: np.dtype, what: str) -> np.ndarray:
    """The array a snapshot holds under ``key`` (its bytes; the count and the layout beside them, under
    "count" and "row" for the rows, "<key>_count" and "<key>_row" otherwise), checked against ``dtype``."""
    count_key, layout_key = ("count", "row") if key == "rows" else (f"{key}_count", f"{key}_row")
    raw, count = obj.get(key), obj.get(count_key)
    if obj.get(layout_key) != repr(dtype.descr):
        raise CorruptFileError(path, f"{what} of an unknown layout {obj.get(layout_key)!r}")
    if not (isinstance(raw, bytes) and _int(count) and count >= 0 and len(raw) == count * dtype.itemsize):
        raise CorruptFileError(path, f"{what} do not match the count {count!r}")
    return np.frombuffer(raw, dtype)


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
    aborted = _array(path, obj, "aborted", ABORTED, "aborted transactions")
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
    data = read_whole(path)
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
        rows = _array(path, obj, "rows", ROW, "rows")
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
