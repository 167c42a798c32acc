"""The files of a partition directory: segment and index names, one segment's in-memory batch index, and the
byte layouts of the ``.index`` and ``log-start-offset`` files (docs/brokers.md, "A partition's log on disk")."""
from __future__ import annotations

import logging
import os
import re
import struct
import sys
import zlib
from array import array
from dataclasses import dataclass

from crc32c import crc32c

from snapshots.storage.disk import CorruptFileError
from snapshots.storage.files import atomic_write

from .recordbatch import BatchError, check_framing

# The partition log's logger: every line about a partition's files is under one name.
log = logging.getLogger("broker.log")

SEGMENT_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
SEGMENT_RE = re.compile(r"^(\d{20})\.log$")
INDEX_RE = re.compile(r"^(\d{20})\.index(\.tmp)?$")
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


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}{SEGMENT_SUFFIX}"


def index_name(base_offset: int) -> str:
    return f"{base_offset:020d}{INDEX_SUFFIX}"


def replace_file(path: str, data: bytes, fsync: bool) -> None:
    """Replace a small file whole: ``atomic_write``, or without fsyncs for a log that does not fsync."""
    if fsync:
        atomic_write(path, data)
    else:
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)


def remove_file(path: str) -> None:
    """Unlink ``path`` if it is there; a failure is a log line (what is left is found again at the next open)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        log.warning("could not remove %s: %s", path, e)


def pread_all(fd: int, n: int, pos: int) -> bytes:
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


class Segment:
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

    def index_batches(self, data: bytes, base_pos: int, running_max: int) -> tuple[int, int, str | None]:
        """Check and index the batches in ``data``, this segment's bytes from ``base_pos`` on, up to the
        first bad one: (the running max timestamp, the bytes of ``data`` indexed, what is wrong or None)."""
        pos = 0
        expected = self.end_offset
        seg_max = self.max_timestamp
        offsets, positions, cummax = self.offsets, self.positions, self.cummax
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
        self.size = base_pos + pos
        self.end_offset = expected
        self.max_timestamp = seg_max
        return running_max, pos, problem

    def time_ms(self) -> int:
        """For retention by time: the largest batch max timestamp, else the file's modification time."""
        if self.max_timestamp >= 0:
            return self.max_timestamp
        try:
            return os.stat(self.path).st_mtime_ns // 1_000_000
        except OSError:
            return NO_TIMESTAMP  # cannot tell: as if new, kept

    def load(self, index: IndexFile) -> None:
        """Take the batches an index file holds (checked against the segment file by the caller)."""
        self.offsets, self.positions, self.cummax = index.offsets, index.positions, index.cummax
        self.size, self.end_offset, self.max_timestamp = index.covered, index.end_offset, index.max_timestamp


# ====================================================================== index files
@dataclass
class IndexFile:
    """What a ``.index`` file says: its segment's first ``covered`` bytes hold these batches."""

    covered: int
    end_offset: int
    max_timestamp: int
    offsets: array
    positions: array
    cummax: array


def encode_index(seg: Segment) -> bytes:
    """The ``.index`` file of ``seg`` as it is now: magic, header, the three arrays, CRC-32C."""
    body = b"".join((INDEX_MAGIC, _INDEX_HEADER.pack(seg.base_offset, seg.size, seg.end_offset, len(seg),
                                                     seg.max_timestamp),
                     _le_bytes(seg.offsets), _le_bytes(seg.positions), _le_bytes(seg.cummax)))
    return body + _LE_U32.pack(crc32c(body))


def parse_index(data: memoryview, base_offset: int, file_size: int) -> IndexFile | str:
    """The index file bytes ``data`` of the segment at ``base_offset`` (``file_size`` bytes long), or what is
    wrong with them.  The last batch it names is not read here: the caller checks it against the segment."""
    if len(data) < _INDEX_START + 4 or data[:len(INDEX_MAGIC)] != INDEX_MAGIC:
        return f"is not an index file (bad magic, or {len(data)} bytes)"
    base, covered, end, count, max_ts = _INDEX_HEADER.unpack_from(data, len(INDEX_MAGIC))
    if count < 1 or len(data) != _INDEX_START + 24 * count + 4:
        return f"is truncated or padded ({len(data)} bytes for {count} batches)"
    if crc32c(data[:-4]) != _LE_U32.unpack_from(data, len(data) - 4)[0]:
        return "is damaged (checksum mismatch)"
    if base != base_offset:
        return f"is for base offset {base}, not {base_offset}"
    if covered > file_size:
        return f"is stale: it covers {covered} bytes, the segment has {file_size}"
    a = _INDEX_START
    offsets = _le_array(data[a:a + 8 * count])
    positions = _le_array(data[a + 8 * count:a + 16 * count])
    cummax = _le_array(data[a + 16 * count:a + 24 * count])
    last_pos = positions[-1]
    if offsets[0] != base or positions[0] != 0 or not 0 <= last_pos < covered:
        return f"is inconsistent (first offset {offsets[0]}, first position {positions[0]}, last {last_pos})"
    return IndexFile(covered, end, max_ts, offsets, positions, cummax)


# ====================================================================== log start offset file
def encode_log_start(offset: int) -> bytes:
    body = _I64.pack(offset)
    return LOG_START_MAGIC + body + _U32.pack(zlib.crc32(body))


def parse_log_start(path: str, data: bytes) -> int:
    """The offset the ``log-start-offset`` file ``path`` holds; ``CorruptFileError`` if ``data`` is not one."""
    if len(data) != len(LOG_START_MAGIC) + 12 or not data.startswith(LOG_START_MAGIC):
        raise CorruptFileError(path, f"not a log start offset file (bad header or {len(data)} bytes)")
    body = data[len(LOG_START_MAGIC):-4]
    if zlib.crc32(body) != _U32.unpack_from(data, len(data) - 4)[0]:
        raise CorruptFileError(path, "checksum mismatch")
    value = _I64.unpack(body)[0]
    if value < 0:
        raise CorruptFileError(path, f"negative log start offset {value}")
    return value


# ====================================================================== retention
def segments_past_retention(sealed: list[Segment], total_bytes: int, retention_bytes: int | None,
                            retention_ms: int | None, now_ms: int | None) -> int:
    """How many of the ``sealed`` segments (oldest first) retention deletes, of a log of ``total_bytes``
    (``PartitionLog.plan_retention`` says the rules)."""
    doomed = 0
    if retention_ms is not None and retention_ms >= 0:
        if now_ms is None:
            raise ValueError("retention by time needs now_ms")
        for seg in sealed:
            if now_ms - seg.time_ms() <= retention_ms:
                break
            doomed += 1
    if retention_bytes is not None and retention_bytes >= 0:
        total = total_bytes
        for k, seg in enumerate(sealed):
            if total - seg.size < retention_bytes:
                break
            total -= seg.size
            doomed = max(doomed, k + 1)
    return doomed
