"""The Raft log on disk: a durable, checksummed journal in pysyncobj's journal interface (duck-typed; nothing
here imports pysyncobj), replacing pysyncobj's mmap that is never fsync'd.  Written through
``snapshots.storage.disk.Disk`` (every I/O error fail-stop); group commit, a sync begun and collected
later, checksummed entries, preallocated room, cuts durable before anything follows them, and the meta
file (term, vote, commit index, log end, recovery target).  ``docs/durability.md`` ("The journal",
"Crash states") says what survives a stop at any instant.
"""
from __future__ import annotations

import logging
import queue
import struct
import threading
import time
import zlib
from typing import Callable, Optional

import msgpack

from snapshots.storage.disk import CorruptFileError, Disk

from .stats import SYNC_BUCKETS, Histogram

log = logging.getLogger(__name__)

MAGIC = b"PQJRNL\x00\x01"
_ENTRY = struct.Struct("<IIQQ")  # payload len, crc32, index, term
META_MAGIC = b"PQMETA\x00\x01"
MAX_ENTRY = 64 * 1024 * 1024
UNKNOWN_INDEX = 1 << 62  # a recovery target whose index is unknown: only a newer term reaches it

Entry = tuple[bytes, int, int]  # (command, index, term), as pysyncobj keeps them
Position = tuple[int, int]      # (term, index): Raft's "at least as up-to-date" order is tuple order


def _crc(index: int, term: int, command: bytes) -> int:
    return zlib.crc32(command, zlib.crc32(struct.pack("<QQ", index, term)))


def encode_entry(command: bytes, index: int, term: int) -> bytes:
    return _ENTRY.pack(len(command), _crc(index, term, command), index, term) + command


def written_length(data: bytes) -> int:
    """How many bytes of a journal file's ``data`` hold its header and its checksum-valid entries: the
    file's length without the zeros a preallocation left after them (or a torn tail)."""
    pos = len(MAGIC) if data.startswith(MAGIC) else 0
    while pos + _ENTRY.size <= len(data):
        length, crc, index, term = _ENTRY.unpack_from(data, pos)
        end = pos + _ENTRY.size + length
        if end > len(data) or _crc(index, term, data[pos + _ENTRY.size:end]) != crc:
            break
        pos = end
    return pos


def _position(obj, path: str, key: str) -> Optional[Position]:
    if obj is None:
        return None
    if (not isinstance(obj, (list, tuple)) or len(obj) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in obj)):
        raise CorruptFileError(path, f"{key} is {obj!r}, not a [term, index] pair")
    return (int(obj[0]), int(obj[1]))


class MetaFile:
    """term / voted_for / commit index / durable log end / recovery target, checksummed, replaced whole."""

    def __init__(self, path: str, disk: Disk):
        self.path = path
        self.disk = disk

    def load(self) -> dict | None:
        """The stored map, or None if there is no meta file."""
        data = self.disk.read(self.path)
        if data is None:
            return None
        if len(data) < len(META_MAGIC) + 4 or not data.startswith(META_MAGIC):
            raise CorruptFileError(self.path, "not a pidquorum meta file (bad header or truncated)")
        body, crc = data[len(META_MAGIC):-4], struct.unpack("<I", data[-4:])[0]
        if zlib.crc32(body) != crc:
            raise CorruptFileError(self.path, "checksum mismatch")
        try:
            meta = msgpack.unpackb(body, raw=False)
        except (ValueError, TypeError, msgpack.UnpackException) as e:  # checksum passed: a writer bug
            raise CorruptFileError(self.path, f"undecodable body: {e}") from None
        if not isinstance(meta, dict):
            raise CorruptFileError(self.path, "meta is not a map")
        for key in ("term", "commit_index"):
            value = meta.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise CorruptFileError(self.path, f"{key} is {value!r}, not a non-negative integer")
        if not isinstance(meta.get("voted_for"), (str, type(None))):
            raise CorruptFileError(self.path, f"voted_for is {meta['voted_for']!r}, not an address or null")
        for key in ("log_end", "recover_to"):
            meta[key] = _position(meta.get(key), self.path, key)
        return meta

    def store(self, meta: dict) -> None:
        body = msgpack.packb(meta, use_bin_type=True)
        self.disk.write_file(self.path, META_MAGIC + body + struct.pack("<I", zlib.crc32(body)))


class InFlight:
    """One fdatasync handed to a ``Syncer``: ``wait()`` returns once it returned, or raises its error."""

    def __init__(self, fn: Callable[[], None]):
        self._fn = fn
        self._done = threading.Event()
        self._error: BaseException | None = None
        self.seconds = 0.0  # how long the fdatasync took

    def run(self) -> None:
        t0 = time.monotonic()
        try:
            self._fn()
        except BaseException as e:  # noqa: BLE001 - handed to the thread that collects it
            self._error = e
        finally:
            self.seconds = time.monotonic() - t0
            self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self) -> None:
        self._done.wait()
        if self._error is not None:
            raise self._error


class Syncer:
    """Where ``DurableJournal.start_sync`` runs the fdatasync.  This one runs it at ``wait()``, on the
    waiting thread: nothing is durable before something waits for it (the simulation's, and the
    most pessimistic ordering a crash can meet)."""

    def submit(self, fn: Callable[[], None]) -> InFlight:
        return _AtWait(fn)

    def close(self) -> None:
        pass


class _AtWait(InFlight):
    def done(self) -> bool:
        return False  # never before something waits for it

    def wait(self) -> None:
        if not self._done.is_set():
            self.run()
        super().wait()


class SyncThread(Syncer):
    """Runs each fdatasync on one daemon thread (os.fdatasync releases the GIL)."""

    def __init__(self, name: str = "journal-sync"):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            job.run()

    def submit(self, fn: Callable[[], None]) -> InFlight:
        job = InFlight(fn)
        self._jobs.put(job)
        return job

    def close(self) -> None:
        self._jobs.put(None)


class DurableJournal:
    def __init__(self, path: str, disk: Disk):
        self.path = path
        self.disk = disk
        self._meta_file = MetaFile(path + ".meta", disk)
        loaded = self._meta_file.load()
        self.meta_missing = loaded is None
        self._meta: dict = loaded or {}
        self._meta_dirty = False
        self.entries: list[Entry] = []
        self._offsets: list[int] = []  # file offset of each entry
        self._pending = bytearray()
        self._durable = 0  # how many of self.entries are on stable storage
        self.syncer: Syncer = Syncer()  # where start_sync's fdatasync runs (RaftNode: its sync thread)
        self._inflight: tuple[InFlight, int, float] | None = None  # (the sync, entries it covers, write s)
        self.syncs = 0
        self.sync_latency = Histogram(SYNC_BUCKETS)  # write + fdatasync of each real sync, seconds
        self.cut_on_open: str | None = None  # what open() cut off, for the adapter's log line
        self.file_was_missing = False
        self._file = None
        self._open()

    # ----------------------------------------------------------------- open
    def _open(self) -> None:
        data = self.disk.read(self.path)
        if data is None or (len(data) < len(MAGIC) and (MAGIC.startswith(data) or not any(data))):
            # No journal (a new node, or one that lost it), or a header cut short (or zeros) by a
            # crash of a version that did not create the file whole: an empty log.  Whether that
            # lost anything is judged against the meta file by the adapter (``raft.loss_evidence``).
            self.file_was_missing = data is None
            self._write_whole([])
            return
        if not data.startswith(MAGIC):
            raise CorruptFileError(self.path, "not a pidquorum journal (bad header)")
        pos = len(MAGIC)
        problem = None
        while pos < len(data):
            entry, end, problem = self._parse_at(data, pos)
            if problem is not None:
                break
            self.entries.append(entry)
            self._offsets.append(pos)
            pos = end
        good_end = pos
        if problem is not None and data.count(0, good_end) == len(data) - good_end:
            problem = None  # zeros after the last entry: the room a preallocation left, not damage
        if problem is not None:
            after = self._valid_entry_after(data, good_end + 1)
            hint = self.durable_hint()
            first_bad = self.entries[-1][1] + 1 if self.entries else None
            if after is not None and (first_bad if first_bad is not None else after - 1) <= hint:
                raise CorruptFileError(self.path, f"{problem}, inside what {self._meta_file.path} records as "
                                                  f"durable (up to index {hint}), and a valid entry (index "
                                                  f"{after}) follows it: synced data was damaged")
            self.cut_on_open = (f"{problem}; cut {len(data) - good_end} bytes after index "
                                f"{self.entries[-1][1] if self.entries else 0} (unsynced writes of a crash)")
            log.warning("journal %s: %s", self.path, self.cut_on_open)
        self._file = self.disk.open_append(self.path, good_end)
        if problem is not None:
            self._file.truncate(good_end)  # synced
        else:
            # What was read may be a killed process's unsynced writes, still in the page cache: a power
            # loss would take them (and they were never acknowledged).  They count as durable, and are
            # reported as this node's log end, only once synced.
            self._file.sync()
        self._durable = len(self.entries)

    def _parse_at(self, data: bytes, pos: int) -> tuple[Entry | None, int, str | None]:
        if pos + _ENTRY.size > len(data):
            return None, pos, f"incomplete entry header at offset {pos}"
        length, crc, index, term = _ENTRY.unpack_from(data, pos)
        end = pos + _ENTRY.size + length
        if length > MAX_ENTRY or end > len(data):
            return None, pos, f"entry at offset {pos} runs past the end of the file"
        command = bytes(data[pos + _ENTRY.size:end])
        if _crc(index, term, command) != crc:
            return None, pos, f"checksum mismatch in entry at offset {pos}"
        if self.entries:
            prev_index, prev_term = self.entries[-1][1], self.entries[-1][2]
            # A checksum-valid entry out of order is never what a crash leaves (cuts are synced before
            # anything is written after them, rewrites are whole files): the file was damaged or spliced.
            if index != prev_index + 1:
                raise CorruptFileError(self.path, f"entry at offset {pos} has index {index}, expected "
                                                  f"{prev_index + 1}")
            if term < prev_term:
                raise CorruptFileError(self.path, f"entry at offset {pos} (index {index}) has term {term} after "
                                                  f"term {prev_term}")
        return (command, index, term), end, None

    @staticmethod
    def _valid_entry_after(data: bytes, start: int) -> int | None:
        """The index of the first checksum-valid entry starting after ``start`` (slow; damaged files only)."""
        limit = min(len(data) - _ENTRY.size, len(data.rstrip(b"\0")) - 1)  # an entry's header is not all zeros
        for pos in range(start, limit + 1):
            length, crc, index, term = _ENTRY.unpack_from(data, pos)
            end = pos + _ENTRY.size + length
            if length == 0 or length > MAX_ENTRY or end > len(data) or index == 0:
                continue
            if _crc(index, term, data[pos + _ENTRY.size:end]) == crc:
                return index
        return None

    def durable_hint(self) -> int:
        """The highest index the meta file records as having been durable (0 if none)."""
        end = self._meta.get("log_end")
        return max(self._meta.get("commit_index", 0), end[1] if end else 0)

    # ------------------------------------------------------------ durability
    def sync(self) -> None:
        """Make every added entry durable (one write + fdatasync for all pending entries)."""
        self._collect()
        t0 = time.monotonic()
        if self._write_pending():
            self._file.sync()
            self._synced(len(self.entries), time.monotonic() - t0)

    def start_sync(self) -> None:
        """Begin making every added entry durable; do not wait (see the module's text).  A sync still in
        flight is left to finish: the entries added since wait for the next one."""
        if self._inflight is not None:
            if not self._inflight[0].done():
                return
            self._collect()
        t0 = time.monotonic()
        if self._write_pending():
            self._inflight = (self.syncer.submit(self._file.sync), len(self.entries), time.monotonic() - t0)

    def _write_pending(self) -> bool:
        """Write the buffered entries (not durable yet); False when every entry is durable already."""
        if self._durable == len(self.entries) and not self._pending:
            return False
        if self._pending:
            self._file.reserve(self._file.size + len(self._pending))
            self._file.write(self._pending)
            self._pending = bytearray()
        return True

    def _collect(self) -> None:
        """Wait for the sync in flight, if any; its entries are durable once it returned (its error is raised)."""
        if self._inflight is None:
            return
        job, covered, write_s = self._inflight
        self._inflight = None
        job.wait()
        self._synced(covered, write_s + job.seconds)

    def _synced(self, covered: int, seconds: float) -> None:
        self._durable = max(self._durable, covered)  # only now: the sync returned
        self.syncs += 1
        self.sync_latency.observe(seconds)

    @property
    def dirty(self) -> bool:
        return self._durable != len(self.entries)

    def durable_end(self) -> Position:
        """(term, index) of the last entry on stable storage ((0, 0) if none)."""
        if self._durable == 0:
            return (0, 0)
        e = self.entries[self._durable - 1]
        return (e[2], e[1])

    def entry(self, index: int) -> Entry | None:
        if not self.entries:
            return None
        pos = index - self.entries[0][1]
        if 0 <= pos < len(self.entries):
            return self.entries[pos]
        return None

    # ------------------------------------------------- pysyncobj's interface
    def add(self, command, idx, term):
        command = bytes(command)
        if self.entries:
            last_idx, last_term = self.entries[-1][1], self.entries[-1][2]
            if idx != last_idx + 1 or term < last_term:
                # The adapter appends only after the last entry; anything else is a bug in it.
                raise AssertionError(f"journal {self.path}: append of index {idx} term {term} after "
                                     f"index {last_idx} term {last_term}")
        blob = encode_entry(command, idx, term)
        self.entries.append((command, idx, term))
        self._offsets.append(self._file.size + len(self._pending))
        self._pending += blob

    def truncate_from(self, index: int) -> int:
        """Raft's conflict cut: drop the entries from ``index`` on, durably.  Returns how many."""
        pos = index - self.entries[0][1] if self.entries else 0
        if pos < 0 or pos >= len(self.entries):
            return 0
        self._collect()  # the file is not touched while a sync is in flight
        dropped = len(self.entries) - pos
        written = self._file.size
        offset = self._offsets[pos]
        if offset >= written:  # only buffered entries are cut
            self._pending = self._pending[:offset - written]
        else:
            self._pending = bytearray()
            self._file.truncate(offset)  # synced: nothing is ever written after an undurable cut
        del self.entries[pos:]
        del self._offsets[pos:]
        self._durable = min(self._durable, len(self.entries))
        return dropped

    def rebase(self, prev: Entry, last: Entry) -> int:
        """Make the log start at a snapshot that ends at ``last`` (``prev`` just before it).

        Entries after ``last`` are kept if the log holds ``last`` itself (same index and term:
        by log matching, the same history); otherwise the log becomes ``[prev, last]``: every
        entry it held is at or below the snapshot, or conflicts with the committed entry the
        snapshot ends at, so it was never committed.  The new file is written whole.  Returns
        how many entries at or after ``last``'s index were dropped (0 when ``last`` matched).
        """
        held = self.entry(last[1])
        if held is not None and held[2] == last[2]:
            pos = last[1] - self.entries[0][1]
            tail = self.entries[pos + 1:]
            dropped = 0
        else:
            tail = []
            dropped = sum(1 for e in self.entries if e[1] >= last[1])
        self._write_whole([tuple(prev), tuple(last)] + tail)
        return dropped

    def _write_whole(self, entries: list) -> None:
        self._collect()  # the file is not replaced while a sync of it is in flight
        blob = bytearray(MAGIC)
        offsets = []
        for command, idx, term in entries:
            offsets.append(len(blob))
            blob += encode_entry(bytes(command), idx, term)
        self.disk.write_file(self.path, bytes(blob))
        new = self.disk.open_append(self.path)  # open the new file before the old one is closed
        if self._file is not None:
            self._file.close()
        self._file = new
        self.entries = [(bytes(c), i, t) for c, i, t in entries]
        self._offsets = offsets
        self._pending = bytearray()
        self._durable = len(self.entries)

    def clear(self):
        raise AssertionError("the Raft adapter owns log cuts (rebase / truncate_from); pysyncobj's clear() "
                             "must not be reached")

    def deleteEntriesFrom(self, entryFrom):
        raise AssertionError("the Raft adapter owns log cuts (truncate_from); pysyncobj's deleteEntriesFrom() "
                             "must not be reached")

    def deleteEntriesTo(self, entryTo):
        raise AssertionError("the Raft adapter owns compaction (rebase); pysyncobj's deleteEntriesTo() "
                             "must not be reached")

    def __getitem__(self, item):
        return self.entries[item]

    def __len__(self):
        return len(self.entries)

    def _destroy(self):
        self.sync()
        self._store_meta()
        self._file.close()

    def flush(self):
        self.sync()

    def setRaftCommitIndex(self, raftCommitIndex):
        # Entries up to the commit index are applied right after this: the local
        # copy must be durable first (a one-node cluster sends nothing to force it).
        self.sync()
        if self._meta.get("commit_index") != raftCommitIndex:
            self._meta["commit_index"] = raftCommitIndex
            self._meta_dirty = True

    def getRaftCommitIndex(self):
        return self._meta.get("commit_index", 1)

    def setCurrentTerm(self, term, votedForNodeId):
        self._meta["term"] = term
        self._meta["voted_for"] = votedForNodeId
        self._store_meta()

    def getCurrentTerm(self):
        return self._meta.get("term", 0)

    def getVotedForNodeId(self):
        return self._meta.get("voted_for")

    def onOneSecondTimer(self):
        if self._meta_dirty:
            self._store_meta()

    # -------------------------------------------------------- adapter's meta
    def meta_term(self) -> int:
        return self._meta.get("term", 0)

    def meta_log_end(self) -> Position | None:
        return self._meta.get("log_end")

    def recovery_target(self) -> Position | None:
        return self._meta.get("recover_to")

    def set_recovery_target(self, target: Position | None) -> None:
        """Durably record (or clear) the position this node must reach before it votes or counts."""
        self._meta["recover_to"] = tuple(target) if target is not None else None
        self._store_meta()

    def clamp_commit_index(self, index: int) -> None:
        if self._meta.get("commit_index", 0) > index:
            self._meta["commit_index"] = index
            self._meta_dirty = True

    def _store_meta(self) -> None:
        self.sync()  # the commit index and log end must never point past the durable log
        self._meta["log_end"] = self.durable_end()
        self._meta_file.store(self._meta)
        self._meta_dirty = False

