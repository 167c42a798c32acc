"""One partition's log: Kafka record batches, back to back, in segment files; checked and recovered on open,
appended with one fsync a call, read by offset or timestamp, trimmed from the start.  The layout, recovery rules,
index files and descriptor sharing are in docs/brokers.md, "A partition's log on disk".

Not thread-safe: ``broker.partition.Partition`` serialises every call (the shared ``SegmentFiles`` has its own lock).
"""
from __future__ import annotations

import bisect
import logging
import os
import time
from array import array
from collections.abc import Iterator

from records.wire.errors import Errors, for_code
from snapshots.storage.disk import CorruptFileError
from snapshots.storage.files import fsync_dir

from .recordbatch import (
    CURRENT_MAGIC,
    HEADER_SIZE,
    BatchError,
    BatchHeader,
    check_framing,
    iter_records,
    parse_header,
    valid_batch_after,
    with_base_offset,
)
from .segment_files import SegmentFiles
from .segments import (
    INDEX_RE,
    LOG_START_FILE,
    NO_TIMESTAMP,
    SEGMENT_RE,
    SEGMENT_SUFFIX,
    Segment,
    encode_index,
    encode_log_start,
    index_name,
    parse_index,
    parse_log_start,
    pread_all,
    remove_file,
    replace_file,
    segment_name,
    segments_past_retention,
)

log = logging.getLogger(__name__)

DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
DEFAULT_INDEX_MIN_BYTES = 256 * 1024

LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2

# The one exception class errors.py registers for OFFSET_OUT_OF_RANGE (one class per code).
OffsetOutOfRangeError = type(for_code(Errors.OFFSET_OUT_OF_RANGE))

__all__ = ["DEFAULT_INDEX_MIN_BYTES", "DEFAULT_SEGMENT_BYTES", "EARLIEST_TIMESTAMP", "LATEST_TIMESTAMP",
           "LOG_START_FILE", "OffsetOutOfRangeError", "PartitionLog", "SegmentFiles", "index_name",
           "segment_name"]


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
        self._segments: list[Segment] = []
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
        return parse_log_start(path, data)

    def _store_log_start(self, offset: int) -> None:
        replace_file(self._lso_path(), encode_log_start(offset), self.fsync)

    def _open(self) -> None:
        bases = []
        indexes = []
        for name in os.listdir(self.directory):
            m = SEGMENT_RE.match(name)
            if m:
                bases.append(int(m.group(1)))
                continue
            m = INDEX_RE.match(name)
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
                remove_file(os.path.join(self.directory, name))
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
            seg = Segment(base, path)
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
                data = pread_all(fd, file_size - covered, covered) if file_size > covered else b""
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

    def _load_index(self, seg: Segment, fd: int, file_size: int) -> int:
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
        remove_file(path)
        return 0

    @staticmethod
    def _check_index(seg: Segment, fd: int, data: memoryview, file_size: int) -> str | None:
        """Fill ``seg`` from index file bytes ``data`` if its last batch is the one the segment holds there;
        None, or what is wrong with them."""
        index = parse_index(data, seg.base_offset, file_size)
        if isinstance(index, str):
            return index
        offsets, covered, end = index.offsets, index.covered, index.end_offset
        last_pos = index.positions[-1]
        raw = pread_all(fd, covered - last_pos, last_pos)
        try:
            h = check_framing(raw)
        except BatchError as e:
            return f"is stale: its last batch (offset {offsets[-1]}, file position {last_pos}) is bad: {e.message}"
        if (h.base_offset, h.size, h.next_offset) != (offsets[-1], len(raw), end) \
                or h.max_timestamp > index.max_timestamp or h.max_timestamp > index.cummax[-1]:
            return (f"is stale: the batch at file position {last_pos} (offsets {h.base_offset}..{h.last_offset}, "
                    f"{h.size} bytes) is not the one it indexes (offset {offsets[-1]}, {len(raw)} bytes, "
                    f"end {end})")
        seg.load(index)
        return None

    def _scan(self, seg: Segment, fd: int, data: bytes, base_pos: int, last: bool, running_max: int) -> int:
        """Check and index the batches in ``data``, the segment's bytes from ``base_pos`` to its end; cut a torn
        tail of the last segment, refuse any other damage."""
        running_max, pos, problem = seg.index_batches(data, base_pos, running_max)
        self.open_stats["scanned_bytes"] += len(data)
        if problem is None:
            return running_max
        if not last:
            raise CorruptFileError(seg.path, f"{problem}; this is not the last segment, so the damaged batches were "
                                             f"acknowledged: refusing to drop them")
        if valid_batch_after(data, pos + 1):
            raise CorruptFileError(seg.path, f"{problem}, and valid batches follow it: the log is corrupt, not torn")
        log.warning("log %s: %s; cutting %d bytes at the end of %s (torn tail of an append cut by a crash; "
                    "never acknowledged)", self.directory, problem, len(data) - pos, os.path.basename(seg.path))
        os.ftruncate(fd, seg.size)
        if self.fsync:
            os.fsync(fd)
        return running_max

    def _new_segment_file(self, base_offset: int) -> Segment:
        path = os.path.join(self.directory, segment_name(base_offset))
        self._files.create(path)
        if self.fsync:
            fsync_dir(self.directory)
        return Segment(base_offset, path)

    def _add_segment(self, seg: Segment) -> None:
        self._segments.append(seg)
        self._bases.append(seg.base_offset)

    # ================================================================ index
    def _write_index(self, seg: Segment) -> None:
        """Persist ``seg``'s index if it is worth it and the file on disk does not cover it all yet.

        Best effort: a failure is a log line (that segment is read whole at the next open)."""
        if not len(seg) or seg.size < self.index_min_bytes or seg.index_size == seg.size:
            return
        try:
            replace_file(seg.index_path, encode_index(seg), self.fsync)
        except OSError as e:
            log.warning("log %s: could not write %s (%s); %s will be read whole at the next open",
                        self.directory, os.path.basename(seg.index_path), e, os.path.basename(seg.path))
            return
        seg.index_size = seg.size

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

    def _flush(self, seg: Segment, buf: bytearray, pending: list[tuple[int, int, int, int]],
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
                remove_file(seg.index_path)
                seg.index_size = -1
            if self.fsync:
                fsync_dir(self.directory)
        except OSError as e2:
            self._failed = f"append failed ({error!r}) and undoing it failed too ({e2!r})"
            log.error("log %s: %s", self.directory, self._failed)

    # ================================================================== read
    def _locate(self, offset: int) -> tuple[Segment, int]:
        """Segment and batch index of the batch containing ``offset`` (which must be inside the log)."""
        k = bisect.bisect_right(self._bases, offset) - 1
        seg = self._segments[k]
        i = bisect.bisect_right(seg.offsets, offset) - 1
        return seg, i

    def _check_offset(self, offset: int) -> None:
        if not self._start <= offset <= self.log_end_offset:
            raise OffsetOutOfRangeError(f"offset {offset} is outside the log [{self._start}, {self.log_end_offset}] "
                                        f"of {self.directory}")

    def _pread(self, seg: Segment, n: int, pos: int) -> bytes:
        with self._files.use(seg.path) as fd:
            return pread_all(fd, n, pos)

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

    def _read_header(self, seg: Segment, i: int) -> BatchHeader:
        return parse_header(self._pread(seg, HEADER_SIZE, seg.positions[i]))

    def _read_batch(self, seg: Segment, i: int) -> bytes:
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
        doomed = segments_past_retention(self._segments[:-1], self.size_bytes, retention_bytes, retention_ms, now_ms)
        return max(self._start, self._segments[doomed].base_offset) if doomed else self._start

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
            remove_file(seg.index_path)  # first: a crash in between leaves a segment without index, not the reverse
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
