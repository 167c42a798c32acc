"""A durable, checksummed Raft journal for pysyncobj.

pysyncobj's own journal is an mmap that is never fsync'd, with no checksums.
This one keeps pysyncobj's journal interface (add / clear / deleteEntriesFrom /
deleteEntriesTo / indexing / term, vote and commit-index metadata) and adds:

* **Group commit.**  ``add`` only buffers; ``sync()`` writes the buffer and
  fdatasyncs once.  The Raft adapter calls ``sync()`` before any message
  leaves the node except the leader's AppendEntries (see ``quorum.raft``), so
  a follower never acknowledges an entry before it is on stable storage; the
  leader syncs right after sending, in parallel with its followers, and
  ``setRaftCommitIndex`` syncs before a new commit index is recorded.  A
  commit therefore means "durable on a majority", the leader included.
* **Checksums.**  Every entry is ``u32 len | u32 crc32 | u64 index | u64 term |
  command``.  On open, a torn *tail* (an incomplete or bad last entry with
  nothing valid after it: the unsynced end of a write cut by a crash) is cut
  off with a warning.  A bad entry with valid entries after it, or a torn tail
  that would lose entries at or below the durable commit index, is corruption:
  the node refuses to start, naming the file and the offset.
* **Durable metadata.**  Term and vote are written (temp, fsync, rename, fsync
  dir) before pysyncobj can send anything that reflects them.  The commit index
  is a hint in Raft; it is written the same way once a second, always after the
  entries it covers are synced, so it never points past the durable log.

Nothing here imports pysyncobj: it is duck-typed to pysyncobj's Journal.
"""
from __future__ import annotations

import logging
import os
import random
import struct
import time
import zlib

import msgpack

from .errors import CorruptFileError
from .fsutil import atomic_write, fsync_dir, write_synced
from .stats import SYNC_BUCKETS, Histogram

log = logging.getLogger(__name__)

MAGIC = b"PQJRNL\x00\x01"
_ENTRY = struct.Struct("<IIQQ")  # payload len, crc32, index, term
META_MAGIC = b"PQMETA\x00\x01"
MAX_ENTRY = 64 * 1024 * 1024

# Set by tests that simulate power loss: after each sync, the journal records
# how many bytes are on stable storage in "<journal>.synced".  A crash test can
# then cut the journal back to exactly what a power loss would have left.
SIMULATE_ENV = "PIDQUORUM_SIMULATE_POWER_LOSS"
# Benchmarks only: PIDQUORUM_UNSAFE_NO_FSYNC=1 skips fdatasync, to measure what
# durability costs.  A node running so logs a warning at start.
NO_FSYNC_ENV = "PIDQUORUM_UNSAFE_NO_FSYNC"
# Chaos tests only (a slow disk): while "<data dir>/fault-sync-delay-ms" holds
# "N" or "MIN-MAX", every sync that has something to write first sleeps N ms
# (or a uniform draw in MIN..MAX).  Switched at run time by creating or removing
# the file; looked at no more than once per FAULT_CHECK_INTERVAL.
FAULT_SYNC_DELAY_FILE = "fault-sync-delay-ms"
EXIT_DIVERGED = 75  # process exit code when a committed entry differs from the leader's
FAULT_CHECK_INTERVAL = 0.1


def _crc(index: int, term: int, command: bytes) -> int:
    return zlib.crc32(command, zlib.crc32(struct.pack("<QQ", index, term)))


def encode_entry(command: bytes, index: int, term: int) -> bytes:
    return _ENTRY.pack(len(command), _crc(index, term, command), index, term) + command


def _read_fault_file(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _parse_delay(text: str | None, path: str) -> tuple[int, int] | None:
    """(min ms, max ms) from a fault-sync-delay-ms file's text; None (no delay) if absent or malformed."""
    if not text:
        return None
    low, _, high = text.partition("-")
    try:
        delay = (int(low), int(high or low))
    except ValueError:
        delay = (-1, -1)
    if not 0 <= delay[0] <= delay[1]:
        log.warning("%s: %r is not 'N' or 'MIN-MAX' (milliseconds); ignored", path, text)
        return None
    return delay if delay[1] > 0 else None


class MetaFile:
    """term / votedFor / commit index, checksummed and replaced atomically."""

    def __init__(self, path: str):
        self.path = path

    def load(self) -> dict:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return {}
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
        return meta

    def store(self, meta: dict) -> None:
        body = msgpack.packb(meta, use_bin_type=True)
        atomic_write(self.path, META_MAGIC + body + struct.pack("<I", zlib.crc32(body)))


class DurableJournal:
    def __init__(self, path: str):
        self.path = path
        self._dir = os.path.dirname(os.path.abspath(path))
        self._meta_file = MetaFile(path + ".meta")
        self._meta = self._meta_file.load()
        self._meta_dirty = False
        self._simulate = bool(os.environ.get(SIMULATE_ENV))
        self._fsync = not os.environ.get(NO_FSYNC_ENV)
        if not self._fsync:
            log.warning("journal %s: %s is set: entries are NOT fsync'd; a power loss can re-issue IDs",
                        path, NO_FSYNC_ENV)
        self.entries: list[tuple[bytes, int, int]] = []
        self._offsets: list[int] = []  # file offset of each entry
        self._pending = bytearray()
        self.syncs = 0
        self.sync_latency = Histogram(SYNC_BUCKETS)  # write + fdatasync of each real sync, seconds
        self.kept_committed = 0  # AppendEntries that asked to cut committed entries (kept; see deleteEntriesFrom)
        self._fault_path = os.path.join(self._dir, FAULT_SYNC_DELAY_FILE)
        self._fault_text: str | None = None
        self._fault_delay: tuple[int, int] | None = None
        self._fault_checked = float("-inf")
        self._open()

    # ----------------------------------------------------------------- open
    def _open(self) -> None:
        if not os.path.exists(self.path):
            self._create()
        with open(self.path, "rb") as f:
            data = f.read()
        if len(data) < len(MAGIC):
            # A crash between creating the file and syncing its header: the file cannot
            # hold an entry, so unless the meta says entries were durable, nothing is lost.
            if "commit_index" in self._meta:
                raise CorruptFileError(self.path, f"{len(data)} bytes, shorter than the journal header, but "
                                                  f"{self._meta_file.path} records entries up to index "
                                                  f"{self.getRaftCommitIndex()} as durable")
            log.warning("journal %s: %d bytes, shorter than its header, and nothing durable in %s "
                        "(a crash while creating it?); starting a fresh journal",
                        self.path, len(data), self._meta_file.path)
            self._create()
            data = MAGIC
        if not data.startswith(MAGIC):
            raise CorruptFileError(self.path, "not a pidquorum journal (bad header or truncated header)")
        pos = len(MAGIC)
        good_end = pos
        problem = None
        while pos < len(data):
            if pos + _ENTRY.size > len(data):
                problem = f"incomplete entry header at offset {pos}"
                break
            length, crc, index, term = _ENTRY.unpack_from(data, pos)
            end = pos + _ENTRY.size + length
            if length > MAX_ENTRY or end > len(data):
                problem = f"entry at offset {pos} runs past the end of the file"
                break
            command = bytes(data[pos + _ENTRY.size:end])
            if _crc(index, term, command) != crc:
                problem = f"checksum mismatch in entry at offset {pos}"
                break
            if self.entries and index != self.entries[-1][1] + 1:
                raise CorruptFileError(self.path, f"entry at offset {pos} has index {index}, "
                                                  f"expected {self.entries[-1][1] + 1}")
            self.entries.append((command, index, term))
            self._offsets.append(pos)
            pos = end
            good_end = pos
        if problem is not None:
            if self._valid_entry_after(data, good_end + 1):
                raise CorruptFileError(self.path, f"{problem}, and valid entries follow it: the journal is "
                                                  f"corrupt, not torn")
            last = self.entries[-1][1] if self.entries else 0
            if "commit_index" in self._meta and self.getRaftCommitIndex() > last:
                raise CorruptFileError(self.path, f"{problem}; cutting the torn tail would lose committed entries "
                                                  f"(durable commit index {self.getRaftCommitIndex()}, "
                                                  f"last good entry {last})")
            log.warning("journal %s: %s; cutting %d unsynced bytes (torn tail from a crash)",
                        self.path, problem, len(data) - good_end)
        last = self.entries[-1][1] if self.entries else 0
        if "commit_index" in self._meta and self.getRaftCommitIndex() > last:
            raise CorruptFileError(self.path, f"the journal ends at index {last} but index "
                                              f"{self.getRaftCommitIndex()} was committed: entries written "
                                              f"before a crash are missing (a disk that lost synced writes?)")
        self._fd = os.open(self.path, os.O_RDWR)
        if good_end != len(data):
            os.ftruncate(self._fd, good_end)
            os.fsync(self._fd)
        self._end = good_end
        self._synced_end = good_end
        os.lseek(self._fd, good_end, os.SEEK_SET)
        self._record_synced()

    def _create(self) -> None:
        """Write a journal holding only its header (replacing whatever is at ``path``), durably."""
        write_synced(self.path, MAGIC)
        fsync_dir(self._dir)

    @staticmethod
    def _valid_entry_after(data: bytes, start: int) -> bool:
        """Is there any checksum-valid entry starting after ``start``?  (Slow; only on a damaged file.)"""
        limit = len(data) - _ENTRY.size
        for pos in range(start, limit + 1):
            length, crc, index, term = _ENTRY.unpack_from(data, pos)
            end = pos + _ENTRY.size + length
            if length == 0 or length > MAX_ENTRY or end > len(data) or index == 0:
                continue
            if _crc(index, term, data[pos + _ENTRY.size:end]) == crc:
                return True
        return False

    # ------------------------------------------------------------ durability
    def sync(self) -> None:
        """Make every added entry durable (one write + fdatasync for all pending entries)."""
        t0 = time.monotonic()
        if self._pending:
            view = memoryview(self._pending)
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
            self._pending = bytearray()
        if self._synced_end != self._end:
            self._synced_end = self._end
            self._fault_sleep()
            if self._fsync:
                os.fdatasync(self._fd)
                self.syncs += 1
                self.sync_latency.observe(time.monotonic() - t0)
                self._record_synced()  # what a power loss would keep: only what was really synced

    def _fault_sleep(self) -> None:
        """The slow-disk fault (see FAULT_SYNC_DELAY_FILE): one clock read when it is off."""
        now = time.monotonic()
        if now - self._fault_checked >= FAULT_CHECK_INTERVAL:
            self._fault_checked = now
            text = _read_fault_file(self._fault_path)
            if text != self._fault_text:
                self._fault_text = text
                delay = _parse_delay(text, self._fault_path)
                if delay:
                    log.warning("journal %s: every sync is delayed %d-%d ms (fault injection: %s)",
                                self.path, *delay, self._fault_path)
                elif self._fault_delay:
                    log.warning("journal %s: sync delay off", self.path)
                self._fault_delay = delay
        if self._fault_delay:
            time.sleep(random.uniform(*self._fault_delay) / 1000)

    def _record_synced(self) -> None:
        if self._simulate:
            with open(self.path + ".synced", "w") as f:
                f.write(str(self._synced_end))

    @property
    def dirty(self) -> bool:
        return self._synced_end != self._end

    # ------------------------------------------------- pysyncobj's interface
    def add(self, command, idx, term):
        command = bytes(command)
        if self.entries and idx <= self.entries[-1][1]:
            self._readd(command, idx, term)
            return
        blob = encode_entry(command, idx, term)
        self.entries.append((command, idx, term))
        self._offsets.append(self._end)
        self._pending += blob
        self._end += len(blob)

    def _readd(self, command: bytes, idx: int, term: int) -> None:
        """A leader re-sending an entry this node kept (see deleteEntriesFrom)."""
        pos = idx - self.entries[0][1]
        if 0 <= pos < len(self.entries) and self.entries[pos][2] == term and self.entries[pos][0] == command:
            return  # the same entry: nothing to do
        held = self.entries[pos] if 0 <= pos < len(self.entries) else None
        # A committed entry that differs from the leader's: the logs have diverged, which Raft
        # rules out.  Serving on would hand out state no other node has: stop the node now.
        log.critical("journal %s: the leader sent entry %d (term %d) but this node holds %s for it, committed; "
                     "stopping: this node's log diverged", self.path, idx, term,
                     f"term {held[2]}" if held else "nothing")
        self.sync()
        os._exit(EXIT_DIVERGED)

    def clear(self):
        self._truncate_at(len(MAGIC))
        self.entries = []
        self._offsets = []

    def deleteEntriesFrom(self, entryFrom):
        """Drop entries[entryFrom:], except committed ones.

        pysyncobj cuts the log after every AppendEntries' prevLogIdx, even where the
        entries match, so a delayed or resent AppendEntries with an older prevLogIdx cut
        entries this node had already committed and applied ("truncating
        already-applied log entries"), and lowered its commit index.  Raft never
        removes a committed entry (every later leader holds the same one), so they are
        kept: the leader's copies, which follow, are recognised in ``add`` and skipped.
        Without this a crash in between left a journal shorter than its durable commit
        index, which the node refuses to start from.
        """
        if entryFrom >= len(self.entries) or not self.entries:
            return
        keep = self._meta.get("commit_index", 0) - self.entries[0][1] + 1  # position after the last committed
        if entryFrom < keep:
            self.kept_committed += 1
            log.info("journal %s: kept committed entries %d..%d that an AppendEntries asked to cut",
                     self.path, self.entries[entryFrom][1], self.entries[min(keep, len(self.entries)) - 1][1])
            entryFrom = keep
            if entryFrom >= len(self.entries):
                return
        offset = self._offsets[entryFrom]
        del self.entries[entryFrom:]
        del self._offsets[entryFrom:]
        self._truncate_at(offset)

    def _truncate_at(self, offset: int) -> None:
        # Flush what is buffered first, so the file matches self._end, then cut.
        if self._pending:
            os.write(self._fd, bytes(self._pending))
            self._pending = bytearray()
        os.ftruncate(self._fd, offset)
        os.lseek(self._fd, offset, os.SEEK_SET)
        self._end = offset
        # Only uncommitted entries are ever cut (Raft); make the new size durable
        # at the next sync all the same, before anything is appended after it.
        self._synced_end = -1

    def deleteEntriesTo(self, entryTo):
        """Log compaction: keep entries[entryTo:], rewriting the file atomically.

        Called after pysyncobj has renamed the new snapshot into place; that
        rename is made durable (fsync of the directory) before the journal loses
        the entries the snapshot now covers.
        """
        fsync_dir(self._dir)
        self.sync()
        keep = self.entries[entryTo:]
        blob = bytearray(MAGIC)
        offsets = []
        for command, idx, term in keep:
            offsets.append(len(blob))
            blob += encode_entry(command, idx, term)
        os.close(self._fd)
        atomic_write(self.path, bytes(blob))
        self._fd = os.open(self.path, os.O_RDWR)
        os.lseek(self._fd, len(blob), os.SEEK_SET)
        self.entries = list(keep)
        self._offsets = offsets
        self._end = self._synced_end = len(blob)
        self._record_synced()

    def __getitem__(self, item):
        return self.entries[item]

    def __len__(self):
        return len(self.entries)

    def _destroy(self):
        self.sync()
        self._store_meta()
        os.close(self._fd)

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

    def _store_meta(self) -> None:
        self.sync()  # the commit index must never point past the durable log
        self._meta_file.store(self._meta)
        self._meta_dirty = False
