"""One partition's log: Kafka record batches, back to back, in segment files.

Layout of a partition directory::

    00000000000000000000.log     segment: raw RecordBatch v2 bytes, named by its base offset
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

**Recovery** (on open).  Every segment is read and every batch's framing, CRC
and base offset checked, building an in-memory index (offset, file position,
running max timestamp per batch).  A bad batch at the end of the *last* segment
with nothing valid after it is the unsynced tail of an append cut by a crash: it
is cut off with a warning (it was never acknowledged).  Anything else - a bad
batch with valid batches after it, damage in an older segment, a missing or
overlapping segment, a log start offset outside the segments - raises
``CorruptFileError`` naming the file and the offset: acknowledged data is never
dropped silently.  Opening costs a read of the retained log (CRC-32C runs at
GB/s; a persisted index would remove this, not needed yet).

**Deletion.**  ``delete_records_before`` moves the log start offset up (made
durable in ``log-start-offset`` before any file goes) and deletes whole segments
entirely below it; ``plan_retention`` says how far ``retention_bytes`` lets the
start move.  The active segment is never deleted.  A caller that keeps state
derived from the log (producer state) must snapshot it before deleting.

Not thread-safe: ``broker.partition.Partition`` serialises every call.
"""
from __future__ import annotations

import bisect
import logging
import os
import re
import struct
import zlib
from array import array
from collections.abc import Iterator

from storage.disk import CorruptFileError
from storage.files import atomic_write, fsync_dir
from wire.errors import Errors, for_code

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
SEGMENT_SUFFIX = ".log"
_SEGMENT_RE = re.compile(r"^(\d{20})\.log$")
LOG_START_FILE = "log-start-offset"
LOG_START_MAGIC = b"PQLSO\x00\x00\x01"
_I64 = struct.Struct(">q")
_U32 = struct.Struct(">I")

LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2

# The one exception class errors.py registers for OFFSET_OUT_OF_RANGE (one class per code).
OffsetOutOfRangeError = type(for_code(Errors.OFFSET_OUT_OF_RANGE))


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}{SEGMENT_SUFFIX}"


class _Segment:
    """One segment file and its in-memory index (parallel arrays, one entry per batch)."""

    __slots__ = ("base_offset", "path", "fd", "size", "end_offset", "offsets", "positions", "cummax")

    def __init__(self, base_offset: int, path: str, fd: int):
        self.base_offset = base_offset
        self.path = path
        self.fd = fd
        self.size = 0
        self.end_offset = base_offset  # offset after the last batch
        self.offsets = array("q")  # base offset of each batch
        self.positions = array("q")  # file position of each batch
        self.cummax = array("q")  # running max of batch max timestamps, over the whole log so far

    def __len__(self) -> int:
        return len(self.offsets)


class PartitionLog:
    def __init__(self, directory: str, *, segment_bytes: int = DEFAULT_SEGMENT_BYTES, fsync: bool = True):
        if segment_bytes < 1:
            raise ValueError("segment_bytes must be positive")
        self.directory = os.path.abspath(directory)
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self._segments: list[_Segment] = []
        self._bases: list[int] = []  # base offset of each segment, for bisect
        self._start = 0
        self._closed = False
        self._failed: str | None = None
        os.makedirs(self.directory, exist_ok=True)
        self._open()

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

    def _store_log_start(self, offset: int) -> None:
        body = _I64.pack(offset)
        data = LOG_START_MAGIC + body + _U32.pack(zlib.crc32(body))
        if self.fsync:
            atomic_write(self._lso_path(), data)
        else:
            tmp = self._lso_path() + ".tmp"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, self._lso_path())

    def _open(self) -> None:
        bases = []
        for name in os.listdir(self.directory):
            m = _SEGMENT_RE.match(name)
            if m:
                bases.append(int(m.group(1)))
            elif name.endswith(SEGMENT_SUFFIX):
                log.warning("log %s: ignoring %s (not a segment name)", self.directory, name)
        bases.sort()
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
        running_max = -(2**63)
        for k, base in enumerate(bases):
            last = k == len(bases) - 1
            path = os.path.join(self.directory, segment_name(base))
            if self._segments and base != self._segments[-1].end_offset:
                prev = self._segments[-1]
                what = "a segment is missing" if base > prev.end_offset else "segments overlap"
                raise CorruptFileError(path, f"segment starts at offset {base} but the previous segment "
                                             f"{os.path.basename(prev.path)} ends at offset {prev.end_offset}: {what}")
            fd = os.open(path, os.O_RDWR)
            seg = _Segment(base, path, fd)
            self._add_segment(seg)  # closed by the caller if anything below fails
            with os.fdopen(os.dup(fd), "rb") as f:
                data = f.read()
            running_max = self._scan(seg, data, last, running_max)
        first = self._segments[0].base_offset
        end = self._segments[-1].end_offset
        if stored_start is None:
            self._start = first
            return
        if stored_start < first:
            raise CorruptFileError(self._segments[0].path,
                                   f"the log start offset is {stored_start} ({LOG_START_FILE}) but the first "
                                   f"segment begins at offset {first}: segments are missing")
        if stored_start > end:
            raise CorruptFileError(self._lso_path(), f"log start offset {stored_start} is past the log end "
                                                     f"offset {end}: acknowledged batches are missing")
        self._start = stored_start
        self._delete_segments_below(stored_start)  # a crash may have stopped a deletion half way

    def _scan(self, seg: _Segment, data: bytes, last: bool, running_max: int) -> int:
        pos = 0
        expected = seg.base_offset
        problem = None
        while pos < len(data):
            try:
                h = check_framing(data, pos)
            except BatchError as e:
                problem = f"bad batch at offset {expected} (file position {pos}): {e.message}"
                break
            if h.base_offset != expected:
                problem = (f"batch at file position {pos} has base offset {h.base_offset}, "
                           f"expected {expected}")
                break
            if h.last_offset_delta < 0:
                problem = f"batch at offset {expected} (file position {pos}) has lastOffsetDelta {h.last_offset_delta}"
                break
            running_max = max(running_max, h.max_timestamp)
            seg.offsets.append(h.base_offset)
            seg.positions.append(pos)
            seg.cummax.append(running_max)
            pos += h.size
            expected = h.next_offset
        seg.size = pos
        seg.end_offset = expected
        if problem is None:
            return running_max
        if not last:
            raise CorruptFileError(seg.path, f"{problem}; this is not the last segment, so the damaged batches were "
                                             f"acknowledged: refusing to drop them")
        if self._valid_batch_after(data, pos + 1):
            raise CorruptFileError(seg.path, f"{problem}, and valid batches follow it: the log is corrupt, not torn")
        log.warning("log %s: %s; cutting %d bytes at the end of %s (torn tail of an append cut by a crash; "
                    "never acknowledged)", self.directory, problem, len(data) - pos, os.path.basename(seg.path))
        os.ftruncate(seg.fd, pos)
        if self.fsync:
            os.fsync(seg.fd)
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
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        if self.fsync:
            fsync_dir(self.directory)
        seg = _Segment(base_offset, path, fd)
        return seg

    def _add_segment(self, seg: _Segment) -> None:
        self._segments.append(seg)
        self._bases.append(seg.base_offset)

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
        call remains in the log and the error is raised.
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
        saved = (len(self._segments), self._segments[-1].size, len(self._segments[-1]), self._segments[-1].end_offset)
        try:
            next_offset = first
            running_max = self._running_max()
            buf = bytearray()
            pending: list[tuple[int, int, int]] = []  # (base offset, position, cummax)
            seg = self._segments[-1]
            for raw, h in zip(batches, headers):
                if seg.size + len(buf) > 0 and seg.size + len(buf) + len(raw) > self.segment_bytes:
                    self._flush(seg, buf, pending, next_offset)
                    buf, pending = bytearray(), []
                    seg = self._new_segment_file(next_offset)
                    self._add_segment(seg)
                running_max = max(running_max, h.max_timestamp)
                pending.append((next_offset, seg.size + len(buf), running_max))
                buf += with_base_offset(raw, next_offset)
                next_offset += h.last_offset_delta + 1
            self._flush(seg, buf, pending, next_offset)
        except BaseException as e:
            self._rollback(saved, e)
            raise
        return first

    def _running_max(self) -> int:
        for seg in reversed(self._segments):
            if len(seg):
                return seg.cummax[-1]
        return -(2**63)

    def _flush(self, seg: _Segment, buf: bytearray, pending: list[tuple[int, int, int]], end_offset: int) -> None:
        view = memoryview(buf)
        pos = seg.size
        while view:
            n = os.pwrite(seg.fd, view, pos)
            view = view[n:]
            pos += n
        if self.fsync:
            os.fsync(seg.fd)
        for base, position, cm in pending:
            seg.offsets.append(base)
            seg.positions.append(position)
            seg.cummax.append(cm)
        seg.size = pos
        seg.end_offset = end_offset

    def _rollback(self, saved: tuple[int, int, int, int], error: BaseException) -> None:
        n_segments, size, n_batches, end_offset = saved
        try:
            while len(self._segments) > n_segments:
                seg = self._segments.pop()
                self._bases.pop()
                os.close(seg.fd)
                os.unlink(seg.path)
            seg = self._segments[-1]
            os.ftruncate(seg.fd, size)
            del seg.offsets[n_batches:]
            del seg.positions[n_batches:]
            del seg.cummax[n_batches:]
            seg.size = size
            seg.end_offset = end_offset
            if self.fsync:
                os.fsync(seg.fd)
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
        return os.pread(seg.fd, end - start, start)

    def _read_header(self, seg: _Segment, i: int) -> BatchHeader:
        data = os.pread(seg.fd, HEADER_SIZE, seg.positions[i])
        return parse_header(data)

    def _read_batch(self, seg: _Segment, i: int) -> bytes:
        end = seg.positions[i + 1] if i + 1 < len(seg) else seg.size
        return os.pread(seg.fd, end - seg.positions[i], seg.positions[i])

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
    def plan_retention(self, retention_bytes: int) -> int:
        """The log start offset that deleting whole old segments down to ``retention_bytes`` would give.

        As Kafka: a segment goes only if the log still holds at least
        ``retention_bytes`` without it; the active segment never goes.
        """
        total = self.size_bytes
        start = self._start
        for k, seg in enumerate(self._segments[:-1]):
            if total - seg.size < retention_bytes:
                break
            total -= seg.size
            start = max(start, self._segments[k + 1].base_offset)
        return start

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
            os.close(seg.fd)
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
            try:
                os.close(seg.fd)
            except OSError:
                pass
        self._segments = []
        self._bases = []

    def close(self) -> None:
        """Close the segment files (appends were already durable).  The offsets stay readable."""
        if self._closed:
            return
        self._closed = True
        for seg in self._segments:
            os.close(seg.fd)

    def __enter__(self) -> "PartitionLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
