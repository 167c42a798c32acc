"""The audit trail: every record a node applied, kept after log compaction.

KIP-730 notes that the metadata log doubles as an audit trail of which broker
got which block; log compaction would throw that away, so each node also
appends what it applies to ``audit.log``: frames of
``u32 length | u32 crc32 | msgpack([AuditEntry, record])``.

Writes are idempotent by Raft index: on restart the node replays its journal
and lines for indexes already in the file are skipped.  A node that received
a snapshot instead of entries writes an ``AuditGap`` line; the other nodes'
trails cover that range.  The file is fsync'd before every snapshot, so no
line is lost for entries the journal then drops.

Start-up cost does not grow with history: each sync also writes
``audit.log.checkpoint`` (atomically) holding the synced length and the last
Raft index in it, like Kafka's recovery-point checkpoint.  On start only the
bytes after that point are read and checked; a file shorter than its
checkpoint lost synced lines and the node refuses to start.  Without a
checkpoint (or with a damaged one, which is only a cache) the whole file is
scanned once.  Readers (``pidctl blocks history``, the audit pipeline) still
check every line's checksum.
"""
from __future__ import annotations

import logging
import struct
import zlib
from dataclasses import dataclass
from typing import Iterator

import msgpack

from records import AuditEntry, AuditGap, Record, RecordError
from records.codec import from_obj, to_obj
from records.schema import RECORDS
from storage.disk import CorruptFileError, Disk

log = logging.getLogger(__name__)
_FRAME = struct.Struct("<II")
_REPLICATED = {spec.type_id for spec in RECORDS}


@dataclass
class AuditLine:
    entry: Record  # AuditEntry or AuditGap
    record: Record | None

    def to_json_dict(self) -> dict:
        if isinstance(self.entry, AuditGap):
            return {"raft_index": self.entry.raft_index, "gap": True}
        out = self.entry.to_dict()
        out["record"] = self.record.to_json_dict() if self.record is not None else None
        return out


def _frame(obj) -> bytes:
    body = msgpack.packb(obj, use_bin_type=True)
    return _FRAME.pack(len(body), zlib.crc32(body)) + body


def read_audit(path: str, start: int = 0) -> tuple[list[AuditLine], int]:
    """All lines of an audit file from byte ``start`` on, and the byte length of its valid part
    (a torn last frame, from a crash mid-append, ends the file; a bad frame with more data after
    it is corruption).  Read-only."""
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read()
    lines, end = parse_audit(path, data, start)
    if end != start + len(data):
        log.warning("audit %s: torn last line at offset %d", path, end)
    return lines, end


def parse_audit(path: str, data: bytes, start: int = 0, tail: bool = False) -> tuple[list[AuditLine], int]:
    """The lines in ``data`` (the file's bytes from offset ``start``) and the end of its valid part.

    ``tail``: ``data`` was never synced (it follows the checkpoint), so a bad line is a crash's torn
    write whatever follows it, not corruption."""
    lines: list[AuditLine] = []
    pos = 0
    while pos < len(data):
        if pos + _FRAME.size > len(data):
            break
        length, crc = _FRAME.unpack_from(data, pos)
        end = pos + _FRAME.size + length
        if end > len(data):
            break
        body = data[pos + _FRAME.size:end]
        if zlib.crc32(body) != crc:
            if end < len(data) and not tail:
                raise CorruptFileError(path, f"checksum mismatch in audit line at offset {start + pos}")
            break
        try:
            obj = msgpack.unpackb(body, raw=False)
            if not isinstance(obj, list) or len(obj) != 2:
                raise RecordError(f"expected [entry, record], got {type(obj).__name__}")
            entry = from_obj(obj[0])
            record = from_obj(obj[1]) if obj[1] is not None else None
            _check_line(entry, record)
        except (RecordError, ValueError, TypeError, IndexError) as e:
            raise CorruptFileError(path, f"bad audit line at offset {start + pos}: {e}") from None
        lines.append(AuditLine(entry, record))
        pos = end
    if pos != len(data) and not tail and _valid_frame_after(data, pos + 1):
        raise CorruptFileError(path, f"damaged audit line at offset {start + pos} with valid lines after it")
    return lines, start + pos


def _check_line(entry: Record, record: Record | None) -> None:
    """An AuditEntry with the replicated record it names, or an AuditGap with none
    (the same checks, in the same words, as the audit exporter's)."""
    if isinstance(entry, AuditGap):
        if record is not None:
            raise RecordError(f"gap line at raft index {entry.raft_index} carries a record")
        return
    if not isinstance(entry, AuditEntry):
        raise RecordError(f"audit line starts with a {entry.SPEC.name}, not an AuditEntry")
    where = f"audit line at raft index {entry.raft_index} position {entry.position}"
    if record is None:
        raise RecordError(f"{where} has no record")
    if record.SPEC.name != entry.record:
        raise RecordError(f"{where} says {entry.record} but holds a {record.SPEC.name}")
    if record.SPEC.type_id not in _REPLICATED:
        raise RecordError(f"{where} holds a {record.SPEC.name}, which is not a replicated record")


def _valid_frame_after(data: bytes, start: int) -> bool:
    """Is there a checksum-valid frame starting after ``start``?  (Only on a damaged file.)"""
    for pos in range(start, len(data) - _FRAME.size + 1):
        length, crc = _FRAME.unpack_from(data, pos)
        end = pos + _FRAME.size + length
        if 0 < length and end <= len(data) and zlib.crc32(data[pos + _FRAME.size:end]) == crc:
            return True
    return False


def checkpoint_path(path: str) -> str:
    return path + ".checkpoint"


def read_checkpoint(path: str, disk: Disk | None = None) -> tuple[int, int] | None:
    """(synced length, last raft index) from the audit file's checkpoint, or None if absent or unusable."""
    cp = checkpoint_path(path)
    raw = (disk or Disk()).read(cp)
    if raw is None:
        return None
    try:
        length, crc = _FRAME.unpack_from(raw, 0)
        body = raw[_FRAME.size:]
        if length != len(body) or zlib.crc32(body) != crc:
            raise ValueError("checksum mismatch")
        obj = msgpack.unpackb(body, raw=False)
        size, last = obj["length"], obj["last_index"]
        if type(size) is not int or type(last) is not int or size < 0 or last < 0:  # inf, 1.5, True ...
            raise ValueError(f"length {size!r} and last_index {last!r} are not integers >= 0")
        return size, last
    except (struct.error, ValueError, TypeError, KeyError, msgpack.UnpackException) as e:
        # Only a cache of what a full scan finds: fall back to the scan, loudly.
        log.warning("audit checkpoint %s unusable (%s); scanning the whole audit file", cp, e)
        return None


class AuditWriter:
    """Appends what this node applies to ``audit.log``, through the node's ``Disk`` (every I/O error is
    fail-stop; the file is synced, and its checkpoint replaced whole, before every snapshot)."""

    def __init__(self, path: str, disk: Disk | None = None):
        self.path = path
        self.disk = disk or Disk()
        self.last_index = 0
        self.scanned_bytes = 0  # how much start-up had to read (constant with a checkpoint)
        size = self.disk.size(path)
        if size is None:
            self.disk.write_file(path, b"")  # created whole, so the directory entry is durable
            size = 0
        cp = read_checkpoint(path, self.disk)
        start = 0
        if cp is not None:
            if size < cp[0]:
                raise CorruptFileError(path, f"file is {size} bytes but {cp[0]} bytes were synced "
                                             f"(checkpoint {checkpoint_path(path)}): audit lines lost")
            start, self.last_index = cp
        # Past the checkpoint nothing was synced: a crash may have persisted those pages in any order,
        # so the first bad line ends the trail there (the journal replays what is cut).
        lines, end = parse_audit(path, self.disk.read(path, start) or b"", start, tail=True)
        self.scanned_bytes = size - start
        self.last_index = max(self.last_index, max((ln.entry.raft_index for ln in lines), default=0))
        self._f = self.disk.open_append(path)
        if end != size:
            log.warning("audit %s: cutting torn last line at offset %d (%d bytes)", path, end, size - end)
            self._f.truncate(end)
        self._checkpointed = -1

    def append(self, raft_index: int, raft_term: int, outcomes) -> None:
        """Record what replay made of each record of the entry at ``raft_index`` (once)."""
        if raft_index <= self.last_index:
            return
        buf = bytearray()
        for pos, outcome in enumerate(outcomes):
            entry = AuditEntry(raft_index=raft_index, raft_term=raft_term, position=pos,
                               accepted=outcome.accepted, error=outcome.error, record=outcome.record.SPEC.name)
            buf += _frame([to_obj(entry), to_obj(outcome.record)])
        if buf:
            self._f.write(buf)
        self.last_index = raft_index

    def gap(self, raft_index: int) -> None:
        """This node jumped to ``raft_index`` through a snapshot."""
        if raft_index <= self.last_index:
            return
        self._f.write(_frame([to_obj(AuditGap(raft_index=raft_index)), None]))
        self.last_index = raft_index

    def sync(self) -> None:
        self._f.sync()
        size = self._f.size
        if size != self._checkpointed:
            body = msgpack.packb({"length": size, "last_index": self.last_index}, use_bin_type=True)
            self.disk.write_file(checkpoint_path(self.path), _FRAME.pack(len(body), zlib.crc32(body)) + body)
            self._checkpointed = size

    def close(self) -> None:
        self.sync()
        self._f.close()


def iter_blocks(paths: list[str]) -> Iterator[dict]:
    """Accepted AllocateProducerIdsRecords from one or more nodes' trails, by Raft index, deduplicated."""
    seen: dict[tuple[int, int], dict] = {}
    for path in paths:
        lines, _ = read_audit(path)
        for ln in lines:
            if isinstance(ln.entry, AuditEntry) and ln.entry.accepted and ln.entry.record == "AllocateProducerIdsRecord":
                key = (ln.entry.raft_index, ln.entry.position)
                seen.setdefault(key, {"raft_index": ln.entry.raft_index, "raft_term": ln.entry.raft_term,
                                      **ln.record.to_dict()})
    for key in sorted(seen):
        yield seen[key]
