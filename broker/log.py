"""One partition's log: Kafka record batches, back to back, in segment files.

Layout of a partition directory::

    00000000000000000000.log     segment: raw RecordBatch v2 bytes, named by its base offset
    00000000000000000000.index   that segment's batch index (written when it is sealed, and on close)
    00000000000000012345.log     ... the last segment is the active one
    log-start-offset             checksummed log start offset (only once records were deleted)

A segment holds the batches exactly as they are served to consumers: the client's
bytes with the base offset rewritten (outside the CRC), so a batch's own length
and CRC-32C frame and check it; there is no extra framing.  Base offsets are
contiguous: each batch starts where the previous one ended, across segments.

**Durability.**  ``append`` writes every batch of the call and fsyncs once
(group commit); when it returns, the batches are on stable storage.  A segment
is fsync'd before the next one is created, so only the last segment can ever
end in a torn write.

**Recovery** (on open).  Every segment's batches are checked - framing, CRC and
base offset - building an in-memory index (offset, file position, running max
timestamp per batch), except the prefix an index file covers (below).  A bad
batch at the end of the *last* segment with nothing valid after it is the
unsynced tail of an append cut by a crash: it is cut off with a warning (it was
never acknowledged).  Anything else - a bad batch with valid batches after it,
damage in an older segment, a missing or overlapping segment, a log start offset
outside the segments - raises ``CorruptFileError`` naming the file and the
offset: acknowledged data is never dropped silently.

**Index files** (fast restart).  Checking every batch in Python costs a few
microseconds a batch, seconds for a million.  So each segment's in-memory index
is persisted in ``<base>.index``: when the segment is sealed (after the append
that rolled past it), for every segment on a clean ``close``, and at open for a
sealed segment that had to be read whole.  Layout: magic, base offset, the
segment size it covers, the end offset, the batch count, the segment's largest
timestamp, the three arrays as little-endian int64, and a CRC-32C of all that;
always replaced whole through ``snapshots.storage.files.atomic_write``.  Segments smaller
than ``index_min_bytes`` get none (reading them costs less than writing one).
On open, a segment whose index is valid loads the arrays and reads only the
bytes after the covered size, with every rule above (a torn tail there is cut;
damage before valid batches is refused).  The last indexed batch is read and
checked too (framing, CRC, offsets): a cheap guard against a segment changed
behind its index.  A missing, damaged or stale index (checksum, another base
offset, covering more than the file holds, a last batch that does not match)
is removed and the segment read whole, with a log line, never an error.

The trade-off: bytes an index covers are not CRC-checked at open - as Kafka
trusts its index files after a clean shutdown and recovers only past the
recovery point.  Damage there after the index was written shows at read time
instead: every consumer checks batch CRCs, and opening without the ``.index``
files (delete them) checks everything and refuses the damage as before.  An
index never covers bytes that were not fsync'd and checked first: it is
written from the in-memory index, which holds only batches that were appended
and fsync'd, or read and checked, and the segment bytes below a covered size
are never rewritten (a rollback or a torn-tail cut only shortens a segment to
a size it had when the index was written, or later).

**File descriptors.**  Segments are opened through ``SegmentFiles``, a bounded
LRU of open descriptors shared by every log of a broker (``broker.storage``
makes one from its ``max_open_segments``); a log opened without one gets its
own, unbounded.  Every operation pins the descriptor it uses for its duration
(``SegmentFiles.use``): eviction - by any thread, for any log - closes only
unpinned descriptors, so a descriptor is never closed under a reader or an
append, and the cache exceeds its bound only by the descriptors pinned at that
moment.  An evicted segment, the active one included, is reopened (O_RDWR) on
its next use.  An append writes and fsyncs through one pinned descriptor, so a
write-back error cannot be lost with a descriptor closed in between.

**Deletion.**  ``delete_records_before`` moves the log start offset up (made
durable in ``log-start-offset`` before any file goes) and deletes whole segments
(index first, then segment) entirely below it; ``plan_retention`` says how far
retention by size (``retention_bytes``) and by time (``retention_ms``, against
each segment's largest timestamp) lets the start move.  The active segment is
never deleted.  A caller that keeps state derived from the log (producer state)
must snapshot it before deleting.

Not thread-safe: ``broker.partition.Partition`` serialises every call (the
shared ``SegmentFiles`` has its own lock).
"""
from __future__ import annotations

import bisect
import contextlib
import logging
import os
import re
import struct
import sys
import threading
import time
import zlib
from array import array
from collections import OrderedDict
from collections.abc import Iterator

from crc32c import crc32c

from snapshots.storage.disk import CorruptFileError
from snapshots.storage.files import atomic_write, fsync_dir
from records.wire.errors import Errors, for_code

from .recordbatch import (
    CURRENT_MAGIC,
    HEADER_SIZE,
    MAGIC_OFFSET,
    BatchError,
    BatchHeader,
    check_framing,
    iter_records,
    parse_header,
    with_base_offset,
)

log = logging.getLogger(__name__)

DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
DEFAULT_INDEX_MIN_BYTES = 256 * 1024
SEGMENT_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
_SEGMENT_RE = re.compile(r"^(\d{20})\.log$")
_INDEX_RE = re.compile(r"^(\d{20})\.index(\.tmp)?$")
LOG_START_FILE = "log-start-offset"
LOG_START_MAGIC = b"PQLSO\x00\x00\x01"
INDEX_MAGIC = b"PQSIDX\x00\x01"
# base offset, segment bytes covered, end offset, batch count, the segment's largest batch max timestamp
_INDEX_HEADER = struct.Struct("<qqqqq")
_INDEX_START = len(INDEX_MAGIC) + _INDEX_HEADER.size
_I64 = struct.Struct(">q")
_U32 = struct.Struct(">I")
_LE_U32 = struct.Struct("<I")
NO_TIMESTAMP = -(2**63)

LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2

# The one exception class errors.py registers for OFFSET_OUT_OF_RANGE (one class per code).
OffsetOutOfRangeError = type(for_code(Errors.OFFSET_OUT_OF_RANGE))


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}{SEGMENT_SUFFIX}"


def index_name(base_offset: int) -> str:
    return f"{base_offset:020d}{INDEX_SUFFIX}"


def _pread_all(fd: int, n: int, pos: int) -> bytes:
    """``n`` bytes at ``pos`` (fewer only at the end of the file); pread may return less for large reads."""
    parts = []
    while n > 0:
        chunk = os.pread(fd, n, pos)
        if not chunk:
            break
        parts.append(chunk)
        n -= len(chunk)
        pos += len(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _le_bytes(a: array) -> bytes:
    if sys.byteorder == "little":
        return a.tobytes()
    b = array("q", a)
    b.byteswap()
    return b.tobytes()


def _le_array(data: memoryview) -> array:
    a = array("q")
    a.frombytes(data)
    if sys.byteorder != "little":
        a.byteswap()
    return a


# ====================================================================== descriptors
class _OpenFile:
    __slots__ = ("fd", "pins", "forgotten")

    def __init__(self, fd: int):
        self.fd = fd
        self.pins = 0
        self.forgotten = False


class SegmentFiles:
    """Open segment descriptors, least recently used closed first: at most ``max_open`` (None: no bound)
    that are not in use.  Thread-safe; shared by the logs of one broker.

    ``use(path)`` opens (or reuses) the file and pins its descriptor until the
    ``with`` block ends: a pinned descriptor is never closed, so the bound is
    exceeded by the descriptors pinned at a moment, not more.  ``forget(path)``
    closes it (before the file is deleted, or when its log closes).
    """

    def __init__(self, max_open: int | None = None):
        if max_open is not None and max_open < 1:
            raise ValueError("max_open must be at least 1")
        self.max_open = max_open
        self._lock = threading.Lock()
        self._files: OrderedDict[str, _OpenFile] = OrderedDict()  # least recently used first
        self._forgotten_pinned = 0
        self.stats = {"opens": 0, "evictions": 0}

    @property
    def open_count(self) -> int:
        """Descriptors open now (pinned ones included)."""
        with self._lock:
            return len(self._files) + self._forgotten_pinned

    @contextlib.contextmanager
    def use(self, path: str) -> Iterator[int]:
        """The descriptor of ``path`` (opened O_RDWR if it is not open), pinned until the block ends."""
        with self._lock:
            entry = self._files.get(path)
            if entry is None:
                entry = _OpenFile(os.open(path, os.O_RDWR))
                self._files[path] = entry
                self.stats["opens"] += 1
            else:
                self._files.move_to_end(path)
            entry.pins += 1
            self._evict()
        try:
            yield entry.fd
        finally:
            with self._lock:
                entry.pins -= 1
                if entry.forgotten:
                    if not entry.pins:
                        self._forgotten_pinned -= 1
                        self._close(path, entry)
                else:
                    self._evict()

    def create(self, path: str) -> None:
        """Create ``path``, which must not exist, and keep its descriptor as the most recently used."""
        with self._lock:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            self._drop(path)  # a descriptor of an older file of that name (a log that was not closed)
            self._files[path] = _OpenFile(fd)
            self.stats["opens"] += 1
            self._evict()

    def forget(self, path: str) -> None:
        """Close the descriptor of ``path`` if open (a pinned one when its last user is done)."""
        with self._lock:
            self._drop(path)

    # under self._lock
    def _drop(self, path: str) -> None:
        entry = self._files.pop(path, None)
        if entry is None:
            return
        if entry.pins:
            entry.forgotten = True
            self._forgotten_pinned += 1
        else:
            self._close(path, entry)

    def _evict(self) -> None:
        if self.max_open is None:
            return
        excess = len(self._files) - self.max_open
        if excess <= 0:
            return
        victims = []
        for path, entry in self._files.items():
            if not entry.pins:
                victims.append(path)
                if len(victims) == excess:
                    break
        for path in victims:
            self._close(path, self._files.pop(path))
            self.stats["evictions"] += 1

    @staticmethod
    def _close(path: str, entry: _OpenFile) -> None:
        try:
            os.close(entry.fd)
        except OSError as e:  # the data was fsync'd through this descriptor already; nothing is lost
            log.warning("closing %s failed: %s", path, e)


# ====================================================================== segments
class _Segment:
    """One segment file and its in-memory index (parallel arrays, one entry per batch)."""

    __slots__ = ("base_offset", "path", "size", "end_offset", "max_timestamp", "index_size", "offsets",
                 "positions", "cummax")

    def __init__(self, base_offset: int, path: str):
        self.base_offset = base_offset
        self.path = path
        self.size = 0
        self.end_offset = base_offset  # offset after the last batch
        self.max_timestamp = NO_TIMESTAMP  # largest batch max timestamp of this segment (time retention)
        self.index_size = -1  # segment bytes the index file on disk covers (-1: no index file)
        self.offsets = array("q")  # base offset of each batch
        self.positions = array("q")  # file position of each batch
        self.cummax = array("q")  # running max of batch max timestamps, over the whole log so far

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def index_path(self) -> str:
        return os.path.join(os.path.dirname(self.path), index_name(self.base_offset))

    def reset(self) -> None:
        self.size = 0
        self.end_offset = self.base_offset
        self.max_timestamp = NO_TIMESTAMP
        self.offsets, self.positions, self.cummax = array("q"), array("q"), array("q")


class PartitionLog:
    def __init__(self, directory: str, *, segment_bytes: int = DEFAULT_SEGMENT_BYTES, fsync: bool = True,
                 files: SegmentFiles | None = None, index_min_bytes: int = DEFAULT_INDEX_MIN_BYTES):
        """``files``: the descriptor cache to open segments through (a broker's ``Storage`` shares one
        among its partitions; default: a private unbounded one).  Segments smaller than
        ``index_min_bytes`` get no index file."""
        if segment_bytes < 1:
            raise ValueError("segment_bytes must be positive")
        self.directory = os.path.abspath(directory)
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self.index_min_bytes = max(1, index_min_bytes)
        self._files = files if files is not None else SegmentFiles()
        self._segments: list[_Segment] = []
        self._bases: list[int] = []  # base offset of each segment, for bisect
        self._start = 0
        self._closed = False
        self._failed: str | None = None
        # What the open did: segments, those loaded from an index, bytes an index covered, bytes read and
        # checked batch by batch, indexes refused, milliseconds.
        self.open_stats = {"segments": 0, "indexed": 0, "indexed_bytes": 0, "scanned_bytes": 0,
                           "index_fallbacks": 0, "open_ms": 0.0}
        os.makedirs(self.directory, exist_ok=True)
        t0 = time.perf_counter()
        self._open()
        self.open_stats["open_ms"] = round((time.perf_counter() - t0) * 1000, 3)

    # ================================================================ open
    def _lso_path(self) -> str:
        return os.path.join(self.directory, LOG_START_FILE)

    def _load_log_start(self) -> int | None:
        path = self._lso_path()
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        if len(data) != len(LOG_START_MAGIC) + 12 or not data.startswith(LOG_START_MAGIC):
            raise CorruptFileError(path, f"not a log start offset file (bad header or {len(data)} bytes)")
        body = data[len(LOG_START_MAGIC):-4]
        if zlib.crc32(body) != _U32.unpack_from(data, len(data) - 4)[0]:
            raise CorruptFileError(path, "checksum mismatch")
        value = _I64.unpack(body)[0]
        if value < 0:
            raise CorruptFileError(path, f"negative log start offset {value}")
        return value

    def _write_file(self, path: str, data: bytes) -> None:
        """Replace a small file whole: ``atomic_write``, or without fsyncs when the log does not fsync."""
        if self.fsync:
            atomic_write(path, data)
        else:
            tmp = path + ".tmp"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)

    def _store_log_start(self, offset: int) -> None:
        body = _I64.pack(offset)
        self._write_file(self._lso_path(), LOG_START_MAGIC + body + _U32.pack(zlib.crc32(body)))

    def _open(self) -> None:
        bases = []
        indexes = []
        for name in os.listdir(self.directory):
            m = _SEGMENT_RE.match(name)
            if m:
                bases.append(int(m.group(1)))
                continue
            m = _INDEX_RE.match(name)
            if m:
                indexes.append((int(m.group(1)), name, bool(m.group(2))))
            elif name.endswith(SEGMENT_SUFFIX):
                log.warning("log %s: ignoring %s (not a segment name)", self.directory, name)
        bases.sort()
        present = set(bases)
        for base, name, tmp in indexes:  # an index write or a segment deletion cut by a crash
            if tmp or base not in present:
                log.info("log %s: removing %s (%s)", self.directory, name,
                         "an index write cut short" if tmp else "its segment is gone")
                self._remove(os.path.join(self.directory, name))
        stored_start = self._load_log_start()
        if not bases:
            if stored_start:
                raise CorruptFileError(self._lso_path(), f"log start offset is {stored_start} but the directory has "
                                                         f"no segment files: the segments are missing")
            self._start = stored_start or 0
            self._add_segment(self._new_segment_file(self._start))
            return
        try:
            self._open_segments(bases, stored_start)
        except BaseException:
            self._close_all()
            raise

    def _open_segments(self, bases: list[int], stored_start: int | None) -> None:
        running_max = NO_TIMESTAMP
        self.open_stats["segments"] = len(bases)
        for k, base in enumerate(bases):
            last = k == len(bases) - 1
            path = os.path.join(self.directory, segment_name(base))
            if self._segments and base != self._segments[-1].end_offset:
                prev = self._segments[-1]
                what = "a segment is missing" if base > prev.end_offset else "segments overlap"
                raise CorruptFileError(path, f"segment starts at offset {base} but the previous segment "
                                             f"{os.path.basename(prev.path)} ends at offset {prev.end_offset}: {what}")
            seg = _Segment(base, path)
            self._add_segment(seg)
            fd = os.open(path, os.O_RDWR)
            try:
                file_size = os.fstat(fd).st_size
                covered = self._load_index(seg, fd, file_size)
                if covered:
                    if seg.cummax[0] < running_max:  # keep the running max monotonic across segments
                        n = bisect.bisect_left(seg.cummax, running_max)
                        seg.cummax[:n] = array("q", [running_max]) * n
                    running_max = max(running_max, seg.cummax[-1])
                data = _pread_all(fd, file_size - covered, covered) if file_size > covered else b""
                running_max = self._scan(seg, fd, data, covered, last, running_max)
            finally:
                os.close(fd)
        first = self._segments[0].base_offset
        end = self._segments[-1].end_offset
        if stored_start is None:
            self._start = first
        elif stored_start < first:
            raise CorruptFileError(self._segments[0].path,
                                   f"the log start offset is {stored_start} ({LOG_START_FILE}) but the first "
                                   f"segment begins at offset {first}: segments are missing")
        elif stored_start > end:
            raise CorruptFileError(self._lso_path(), f"log start offset {stored_start} is past the log end "
                                                     f"offset {end}: acknowledged batches are missing")
        else:
            self._start = stored_start
            self._delete_segments_below(stored_start)  # a crash may have stopped a deletion half way
        for seg in self._segments[:-1]:  # sealed segments read whole: next time from their index
            self._write_index(seg)

    def _load_index(self, seg: _Segment, fd: int, file_size: int) -> int:
        """Load ``seg``'s arrays from its index file; the segment bytes it covers (0: read it whole)."""
        path = seg.index_path
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            if file_size >= self.index_min_bytes:
                log.info("log %s: %s has no index file; reading it whole", self.directory,
                         os.path.basename(seg.path))
            return 0
        except OSError as e:
            problem = f"cannot be read ({e})"
        else:
            problem = self._check_index(seg, fd, memoryview(data), file_size)
            if problem is None:
                seg.index_size = seg.size
                self.open_stats["indexed"] += 1
                self.open_stats["indexed_bytes"] += seg.size
                return seg.size
        seg.reset()
        self.open_stats["index_fallbacks"] += 1
        log.warning("log %s: index %s %s; reading %s whole instead", self.directory, os.path.basename(path),
                    problem, os.path.basename(seg.path))
        self._remove(path)
        return 0

    @staticmethod
    def _check_index(seg: _Segment, fd: int, data: memoryview, file_size: int) -> str | None:
        """Fill ``seg`` from index file bytes ``data``; None, or what is wrong with them."""
        if len(data) < _INDEX_START + 4 or data[:len(INDEX_MAGIC)] != INDEX_MAGIC:
            return f"is not an index file (bad magic, or {len(data)} bytes)"
        base, covered, end, count, max_ts = _INDEX_HEADER.unpack_from(data, len(INDEX_MAGIC))
        if count < 1 or len(data) != _INDEX_START + 24 * count + 4:
            return f"is truncated or padded ({len(data)} bytes for {count} batches)"
        if crc32c(data[:-4]) != _LE_U32.unpack_from(data, len(data) - 4)[0]:
            return "is damaged (checksum mismatch)"
        if base != seg.base_offset:
            return f"is for base offset {base}, not {seg.base_offset}"
        if covered > file_size:
            return f"is stale: it covers {covered} bytes, the segment has {file_size}"
        a = _INDEX_START
        offsets = _le_array(data[a:a + 8 * count])
        positions = _le_array(data[a + 8 * count:a + 16 * count])
        cummax = _le_array(data[a + 16 * count:a + 24 * count])
        last_pos = positions[-1]
        if offsets[0] != base or positions[0] != 0 or not 0 <= last_pos < covered:
            return f"is inconsistent (first offset {offsets[0]}, first position {positions[0]}, last {last_pos})"
        raw = _pread_all(fd, covered - last_pos, last_pos)
        try:
            h = check_framing(raw)
        except BatchError as e:
            return f"is stale: its last batch (offset {offsets[-1]}, file position {last_pos}) is bad: {e.message}"
        if (h.base_offset, h.size, h.next_offset) != (offsets[-1], len(raw), end) or h.max_timestamp > max_ts \
                or h.max_timestamp > cummax[-1]:
            return (f"is stale: the batch at file position {last_pos} (offsets {h.base_offset}..{h.last_offset}, "
                    f"{h.size} bytes) is not the one it indexes (offset {offsets[-1]}, {len(raw)} bytes, "
                    f"end {end})")
        seg.offsets, seg.positions, seg.cummax = offsets, positions, cummax
        seg.size, seg.end_offset, seg.max_timestamp = covered, end, max_ts
        return None

    def _scan(self, seg: _Segment, fd: int, data: bytes, base_pos: int, last: bool, running_max: int) -> int:
        """Check and index the batches in ``data``, the segment's bytes from ``base_pos`` to its end."""
        pos = 0
        expected = seg.end_offset
        seg_max = seg.max_timestamp
        offsets, positions, cummax = seg.offsets, seg.positions, seg.cummax
        problem = None
        while pos < len(data):
            try:
                h = check_framing(data, pos)
            except BatchError as e:
                problem = f"bad batch at offset {expected} (file position {base_pos + pos}): {e.message}"
                break
            if h.base_offset != expected:
                problem = (f"batch at file position {base_pos + pos} has base offset {h.base_offset}, "
                           f"expected {expected}")
                break
            if h.last_offset_delta < 0:
                problem = (f"batch at offset {expected} (file position {base_pos + pos}) has lastOffsetDelta "
                           f"{h.last_offset_delta}")
                break
            if h.max_timestamp > running_max:
                running_max = h.max_timestamp
            if h.max_timestamp > seg_max:
                seg_max = h.max_timestamp
            offsets.append(h.base_offset)
            positions.append(base_pos + pos)
            cummax.append(running_max)
            pos += h.size
            expected = h.next_offset
        seg.size = base_pos + pos
        seg.end_offset = expected
        seg.max_timestamp = seg_max
        self.open_stats["scanned_bytes"] += len(data)
        if problem is None:
            return running_max
        if not last:
            raise CorruptFileError(seg.path, f"{problem}; this is not the last segment, so the damaged batches were "
                                             f"acknowledged: refusing to drop them")
        if self._valid_batch_after(data, pos + 1):
            raise CorruptFileError(seg.path, f"{problem}, and valid batches follow it: the log is corrupt, not torn")
        log.warning("log %s: %s; cutting %d bytes at the end of %s (torn tail of an append cut by a crash; "
                    "never acknowledged)", self.directory, problem, len(data) - pos, os.path.basename(seg.path))
        os.ftruncate(fd, seg.size)
        if self.fsync:
            os.fsync(fd)
        return running_max

    @staticmethod
    def _valid_batch_after(data: bytes, start: int) -> bool:
        """Does any checksum-valid v2 batch start at or after ``start``?  (Slow-ish; only on a damaged file.)"""
        magic = bytes([CURRENT_MAGIC])
        idx = data.find(magic, start + MAGIC_OFFSET)
        while idx != -1:
            try:
                check_framing(data, idx - MAGIC_OFFSET)
                return True
            except BatchError:
                pass
            idx = data.find(magic, idx + 1)
        return False

    def _new_segment_file(self, base_offset: int) -> _Segment:
        path = os.path.join(self.directory, segment_name(base_offset))
        self._files.create(path)
        if self.fsync:
            fsync_dir(self.directory)
        return _Segment(base_offset, path)

    def _add_segment(self, seg: _Segment) -> None:
        self._segments.append(seg)
        self._bases.append(seg.base_offset)

    # ================================================================ index
    def _write_index(self, seg: _Segment) -> None:
        """Persist ``seg``'s index if it is worth it and the file on disk does not cover it all yet.

        Best effort: a failure is a log line (that segment is read whole at the next open)."""
        if not len(seg) or seg.size < self.index_min_bytes or seg.index_size == seg.size:
            return
        body = b"".join((INDEX_MAGIC, _INDEX_HEADER.pack(seg.base_offset, seg.size, seg.end_offset, len(seg),
                                                         seg.max_timestamp),
                         _le_bytes(seg.offsets), _le_bytes(seg.positions), _le_bytes(seg.cummax)))
        try:
            self._write_file(seg.index_path, body + _LE_U32.pack(crc32c(body)))
        except OSError as e:
            log.warning("log %s: could not write %s (%s); %s will be read whole at the next open",
                        self.directory, os.path.basename(seg.index_path), e, os.path.basename(seg.path))
            return
        seg.index_size = seg.size

    @staticmethod
    def _remove(path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("could not remove %s: %s", path, e)

    # ============================================================ properties
    @property
    def log_start_offset(self) -> int:
        return self._start

    @property
    def log_end_offset(self) -> int:
        return self._segments[-1].end_offset

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    @property
    def segment_base_offsets(self) -> list[int]:
        return list(self._bases)

    # ================================================================ append
    def _check_usable(self) -> None:
        if self._closed:
            raise ValueError(f"log {self.directory} is closed")
        if self._failed:
            raise OSError(f"log {self.directory} failed earlier and must be reopened: {self._failed}")

    def append(self, batches: list[bytes]) -> int:
        """Append whole batches at the log end; return the first offset assigned.

        Base offsets are rewritten to consecutive offsets from ``log_end_offset``.
        The batches must be valid (``recordbatch.split_batches``): only their
        size and magic are re-checked here.  Durable when it returns (one fsync
        per call, plus one per segment rolled).  On an I/O error, nothing of the
        call remains in the log and the error is raised.  The segments it
        sealed get their index files after the append succeeded.
        """
        self._check_usable()
        if not batches:
            raise ValueError("append needs at least one batch")
        headers = []
        for raw in batches:
            h = parse_header(raw)
            if h.magic != CURRENT_MAGIC or h.size != len(raw) or h.last_offset_delta < 0:
                raise ValueError(f"not a whole v2 batch (magic {h.magic}, batchLength {h.batch_length}, "
                                 f"{len(raw)} bytes)")
            headers.append(h)
        first = self.log_end_offset
        active = self._segments[-1]
        saved = (len(self._segments), active.size, len(active), active.end_offset, active.max_timestamp)
        sealed = []
        try:
            next_offset = first
            running_max = self._running_max()
            buf = bytearray()
            pending: list[tuple[int, int, int, int]] = []  # (base offset, position, cummax, max timestamp)
            seg = active
            for raw, h in zip(batches, headers):
                if seg.size + len(buf) > 0 and seg.size + len(buf) + len(raw) > self.segment_bytes:
                    self._flush(seg, buf, pending, next_offset)
                    sealed.append(seg)
                    buf, pending = bytearray(), []
                    seg = self._new_segment_file(next_offset)
                    self._add_segment(seg)
                running_max = max(running_max, h.max_timestamp)
                pending.append((next_offset, seg.size + len(buf), running_max, h.max_timestamp))
                buf += with_base_offset(raw, next_offset)
                next_offset += h.last_offset_delta + 1
            self._flush(seg, buf, pending, next_offset)
        except BaseException as e:
            self._rollback(saved, e)
            raise
        for seg in sealed:
            self._write_index(seg)
        return first

    def _running_max(self) -> int:
        for seg in reversed(self._segments):
            if len(seg):
                return seg.cummax[-1]
        return NO_TIMESTAMP

    def _flush(self, seg: _Segment, buf: bytearray, pending: list[tuple[int, int, int, int]],
               end_offset: int) -> None:
        view = memoryview(buf)
        pos = seg.size
        with self._files.use(seg.path) as fd:
            while view:
                n = os.pwrite(fd, view, pos)
                view = view[n:]
                pos += n
            if self.fsync:
                os.fsync(fd)
        seg_max = seg.max_timestamp
        for base, position, cm, ts in pending:
            seg.offsets.append(base)
            seg.positions.append(position)
            seg.cummax.append(cm)
            if ts > seg_max:
                seg_max = ts
        seg.size = pos
        seg.end_offset = end_offset
        seg.max_timestamp = seg_max

    def _rollback(self, saved: tuple[int, int, int, int, int], error: BaseException) -> None:
        n_segments, size, n_batches, end_offset, max_timestamp = saved
        try:
            while len(self._segments) > n_segments:
                seg = self._segments.pop()
                self._bases.pop()
                self._files.forget(seg.path)
                os.unlink(seg.path)
            seg = self._segments[-1]
            with self._files.use(seg.path) as fd:
                os.ftruncate(fd, size)
                if self.fsync:
                    os.fsync(fd)
            del seg.offsets[n_batches:]
            del seg.positions[n_batches:]
            del seg.cummax[n_batches:]
            seg.size = size
            seg.end_offset = end_offset
            seg.max_timestamp = max_timestamp
            if seg.index_size > size:  # never (indexes are written after an append succeeded): a guard
                self._remove(seg.index_path)
                seg.index_size = -1
            if self.fsync:
                fsync_dir(self.directory)
        except OSError as e2:
            self._failed = f"append failed ({error!r}) and undoing it failed too ({e2!r})"
            log.error("log %s: %s", self.directory, self._failed)

    # ================================================================== read
    def _locate(self, offset: int) -> tuple[_Segment, int]:
        """Segment and batch index of the batch containing ``offset`` (which must be inside the log)."""
        k = bisect.bisect_right(self._bases, offset) - 1
        seg = self._segments[k]
        i = bisect.bisect_right(seg.offsets, offset) - 1
        return seg, i

    def _check_offset(self, offset: int) -> None:
        if not self._start <= offset <= self.log_end_offset:
            raise OffsetOutOfRangeError(f"offset {offset} is outside the log [{self._start}, {self.log_end_offset}] "
                                        f"of {self.directory}")

    def _pread(self, seg: _Segment, n: int, pos: int) -> bytes:
        with self._files.use(seg.path) as fd:
            return _pread_all(fd, n, pos)

    def read(self, offset: int, max_bytes: int) -> bytes:
        """Whole batches from the one containing ``offset``, up to ``max_bytes`` but at least one batch.

        Empty at the log end.  Raises ``OffsetOutOfRangeError`` (code
        OFFSET_OUT_OF_RANGE) outside [log_start_offset, log_end_offset].  The
        first batch may begin before ``offset`` (consumers skip such records,
        as with Kafka).  One call reads from one segment only.
        """
        self._check_usable()
        self._check_offset(offset)
        if offset == self.log_end_offset:
            return b""
        seg, i = self._locate(offset)
        start = seg.positions[i]
        n = len(seg)
        limit = start + max(max_bytes, 0)
        k = bisect.bisect_right(seg.positions, limit, i + 1, n)  # batches i+1..k-1 start at or below limit
        if k == n and seg.size <= limit:
            end = seg.size
        elif k - 1 >= i + 1:
            end = seg.positions[k - 1]
        else:
            end = seg.positions[i + 1] if i + 1 < n else seg.size
        return self._pread(seg, end - start, start)

    def _read_header(self, seg: _Segment, i: int) -> BatchHeader:
        return parse_header(self._pread(seg, HEADER_SIZE, seg.positions[i]))

    def _read_batch(self, seg: _Segment, i: int) -> bytes:
        end = seg.positions[i + 1] if i + 1 < len(seg) else seg.size
        return self._pread(seg, end - seg.positions[i], seg.positions[i])

    def iter_headers(self, from_offset: int) -> Iterator[BatchHeader]:
        """Headers of every batch holding an offset >= ``from_offset`` (clamped to the log start), in order."""
        self._check_usable()
        offset = max(from_offset, self._start)
        if offset >= self.log_end_offset:
            return
        seg, i = self._locate(offset)
        k = self._segments.index(seg)
        for seg in self._segments[k:]:
            for j in range(i, len(seg)):
                yield self._read_header(seg, j)
            i = 0

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """ListOffsets: the earliest offset whose record timestamp is >= ``timestamp_ms``, and that timestamp.

        ``-1`` (LATEST) gives ``(log_end_offset, -1)`` and ``-2`` (EARLIEST)
        gives ``(log_start_offset, -1)``, as Kafka answers; other negative
        values raise ``ValueError``.  ``None`` when no record is that late.
        Uncompressed batches are searched record by record; for a compressed
        batch the answer is its first offset and its max timestamp (earlier
        than Kafka's exact answer, never later: a consumer sees every record at
        or after the time, maybe a few before).
        """
        self._check_usable()
        if timestamp_ms == LATEST_TIMESTAMP:
            return self.log_end_offset, -1
        if timestamp_ms == EARLIEST_TIMESTAMP:
            return self._start, -1
        if timestamp_ms < 0:
            raise ValueError(f"unsupported ListOffsets timestamp {timestamp_ms}")
        k = bisect.bisect_left([s.cummax[-1] if len(s) else -(2**63) for s in self._segments], timestamp_ms)
        if k == len(self._segments):
            return None
        first = True
        for seg in self._segments[k:]:
            i = bisect.bisect_left(seg.cummax, timestamp_ms) if first else 0
            first = False
            for j in range(i, len(seg)):
                h = self._read_header(seg, j)
                if h.max_timestamp < timestamp_ms or h.last_offset < self._start:
                    continue
                if h.compression != 0:
                    return max(h.base_offset, self._start), h.max_timestamp
                for rec in iter_records(self._read_batch(seg, j)):
                    if rec.offset >= self._start and rec.timestamp >= timestamp_ms:
                        return rec.offset, rec.timestamp
        return None

    # ============================================================== deletion
    def plan_retention(self, retention_bytes: int | None = None, retention_ms: int | None = None,
                       now_ms: int | None = None) -> int:
        """The log start offset that deleting whole old segments for retention would give (deletes nothing).

        As Kafka: by size, a segment goes only if the log still holds at least
        ``retention_bytes`` without it; by time, a segment goes once its largest
        batch max timestamp is more than ``retention_ms`` before ``now_ms`` (a
        segment without timestamps: its file's modification time).  Oldest
        first, stopping at the first segment that must stay; the active segment
        never goes.  None or a negative value (Kafka's -1): no limit of that
        kind.  With both, whichever deletes more.
        """
        sealed = self._segments[:-1]
        doomed = 0
        if retention_ms is not None and retention_ms >= 0:
            if now_ms is None:
                raise ValueError("retention by time needs now_ms")
            for seg in sealed:
                if now_ms - self._segment_time(seg) <= retention_ms:
                    break
                doomed += 1
        if retention_bytes is not None and retention_bytes >= 0:
            total = self.size_bytes
            for k, seg in enumerate(sealed):
                if total - seg.size < retention_bytes:
                    break
                total -= seg.size
                doomed = max(doomed, k + 1)
        return max(self._start, self._segments[doomed].base_offset) if doomed else self._start

    @staticmethod
    def _segment_time(seg: _Segment) -> int:
        if seg.max_timestamp >= 0:
            return seg.max_timestamp
        try:
            return os.stat(seg.path).st_mtime_ns // 1_000_000
        except OSError:
            return NO_TIMESTAMP  # cannot tell: as if new, kept

    def delete_records_before(self, offset: int) -> int:
        """Move the log start offset up to ``offset`` and delete the segments entirely below it.

        ``offset`` may be inside a segment (Kafka's DeleteRecords): reads
        below it are then out of range although the bytes stay until the
        whole segment can go.  Returns the new log start offset.  Raises
        ``OffsetOutOfRangeError`` past the log end.
        """
        self._check_usable()
        if offset > self.log_end_offset:
            raise OffsetOutOfRangeError(f"cannot delete records before {offset}: the log ends at "
                                        f"{self.log_end_offset}")
        if offset <= self._start:
            return self._start
        self._store_log_start(offset)  # durable before any file goes
        self._start = offset
        self._delete_segments_below(offset)
        return offset

    def _delete_segments_below(self, offset: int) -> None:
        doomed = 0
        while doomed + 1 < len(self._segments) and self._segments[doomed + 1].base_offset <= offset:
            doomed += 1
        if not doomed:
            return
        for seg in self._segments[:doomed]:
            self._files.forget(seg.path)
            self._remove(seg.index_path)  # first: a crash in between leaves a segment without index, not the reverse
            os.unlink(seg.path)
            log.info("log %s: deleted segment %s (below log start offset %d)", self.directory,
                     os.path.basename(seg.path), offset)
        del self._segments[:doomed]
        del self._bases[:doomed]
        if self.fsync:
            fsync_dir(self.directory)

    # ================================================================= close
    def _close_all(self) -> None:
        for seg in self._segments:
            self._files.forget(seg.path)
        self._segments = []
        self._bases = []

    def close(self) -> None:
        """Write the index files not yet written (the active segment's) and close the segment files.

        Appends were already durable; the offsets stay readable.
        """
        if self._closed:
            return
        self._closed = True
        try:
            if not self._failed:
                for seg in self._segments:
                    self._write_index(seg)
        finally:
            for seg in self._segments:
                self._files.forget(seg.path)

    def __enter__(self) -> "PartitionLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
