"""The audit trail: every record a node applied (``audit.log``), kept after log compaction, with a
checkpoint (``audit.log.checkpoint``) so that start-up reads only what follows the last sync.  Writes are
idempotent by Raft index; the file is synced before every snapshot.  Format and crash states:
``docs/durability.md`` ("The audit trail", "Crash states").
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
from snapshots.storage.disk import CorruptFileError, Disk

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
        lines.append(_decode_line(path, body, start + pos))
        pos = end
    if pos != len(data) and not tail and _valid_frame_after(data, pos + 1):
        raise CorruptFileError(path, f"damaged audit line at offset {start + pos} with valid lines after it")
    return lines, start + pos


def _decode_line(path: str, body: bytes, offset: int) -> AuditLine:
    """The line whose (checksum-valid) frame body is ``body``, at ``offset`` of the file."""
    try:
        obj = msgpack.unpackb(body, raw=False)
        if not isinstance(obj, list) or len(obj) != 2:
            raise RecordError(f"expected [entry, record], got {type(obj).__name__}")
        entry = from_obj(obj[0])
        record = from_obj(obj[1]) if obj[1] is not None else None
        _check_line(entry, record)
    except (RecordError, ValueError, TypeError, IndexError, msgpack.UnpackException) as e:
        raise CorruptFileError(path, f"bad audit line at offset {offset}: {e}") from None
    return AuditLine(entry, record)


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

    def extent(self) -> tuple[int, int]:
        """(last Raft index, bytes) of what was written whole, for a reader in another thread: every line
        up to that index is in those bytes (read in this order: ``append`` writes, then moves the index)."""
        last = self.last_index
        return last, self._f.size

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


def _block(ln: AuditLine) -> dict | None:
    """The block an audit line records (``pidctl blocks history``'s dict), or None if it records none."""
    if isinstance(ln.entry, AuditEntry) and ln.entry.accepted and ln.entry.record == "AllocateProducerIdsRecord":
        return {"raft_index": ln.entry.raft_index, "raft_term": ln.entry.raft_term, **ln.record.to_dict()}
    return None


def _key(entry: Record) -> tuple[int, int]:
    """Where a line is in Raft order: (raft index, position in the entry; -1 for a gap line)."""
    return entry.raft_index, -1 if isinstance(entry, AuditGap) else entry.position


def iter_blocks(paths: list[str]) -> Iterator[dict]:
    """Accepted AllocateProducerIdsRecords from one or more nodes' trails, by Raft index, deduplicated."""
    seen: dict[tuple[int, int], dict] = {}
    for path in paths:
        lines, _ = read_audit(path)
        for ln in lines:
            block = _block(ln)
            if block is not None:
                seen.setdefault(_key(ln.entry), block)
    for key in sorted(seen):
        yield seen[key]


def merge_histories(histories: list[tuple[list[dict], list[tuple[int, int]], int]]) -> tuple[list[dict],
                                                                                           list[tuple[int, int]]]:
    """Several nodes' block histories (each: its blocks, its trail's gaps as (after_index, raft_index], the
    last Raft index it covers) as one, as ``iter_blocks`` merges their files: every block once, in Raft
    order; and the ranges (after_index, raft_index] of Raft indexes that no node's trail holds (each
    node installed a snapshot over them, or had not applied them yet), which may hide blocks."""
    seen: dict[tuple[int, int], dict] = {}
    for blocks, _, _ in histories:
        for b in blocks:
            seen.setdefault((b["raft_index"], b["producer_id_start"]), b)
    end = max((last for _, _, last in histories), default=0)
    # A Raft index is missing when every node misses it: in one of its gaps, or after its last index.
    missing: list[tuple[int, int]] | None = None
    for _, gaps, last in histories:
        mine = sorted([(a, b) for a, b in gaps if b > a] + ([(last, end)] if last < end else []))
        missing = mine if missing is None else _intersect(missing, mine)
    return [seen[k] for k in sorted(seen)], missing or []


def _intersect(xs: list[tuple[int, int]], ys: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The intersection of two sorted lists of half-open ranges (a, b]."""
    out = []
    for a, b in xs:
        for c, d in ys:
            lo, hi = max(a, c), min(b, d)
            if lo < hi:
                out.append((lo, hi))
    return sorted(out)


# ------------------------------------------------------------------ a node's trail, a page at a time
PAGE_BYTES = 1 << 20  # trail bytes one BlockHistoryRequest reads at most (its answer's time and size are bounded)
NO_CURSOR = (-1, -1, -1)


@dataclass
class BlockPage:
    """A page of one node's trail (``read_block_page``).  ``cursor``: (raft index, position, offset) of the
    last line read, where the next page starts; ``gaps``: [after_index, raft_index] of each snapshot the
    node installed (its trail has nothing after after_index up to raft_index); ``more``: lines remain."""
    blocks: list[dict]
    gaps: list[list[int]]
    cursor: tuple[int, int, int]
    more: bool


def _line_at(f, path: str, offset: int, end: int) -> AuditLine | None:
    """The line whose frame starts at ``offset`` (before ``end``), or None if no whole, valid one does."""
    f.seek(offset)
    head = f.read(_FRAME.size)
    if len(head) < _FRAME.size:
        return None
    length, crc = _FRAME.unpack(head)
    if offset + _FRAME.size + length > end:
        return None
    body = f.read(length)
    if len(body) != length or zlib.crc32(body) != crc:
        return None
    try:
        return _decode_line(path, body, offset)
    except CorruptFileError:
        return None


def read_block_page(path: str, end: int, last_index: int, after: tuple[int, int] = (-1, -1),
                    cursor_offset: int = -1, limit: int = 1000, broker_id: int | None = None,
                    max_bytes: int = PAGE_BYTES) -> BlockPage:
    """The blocks of the trail ``path`` after the line ``after`` (raft index, position), in Raft order: at
    most ``limit``, reading at most about ``max_bytes`` of the file, only lines in its first ``end`` bytes and
    up to Raft index ``last_index`` (what the writer had written whole: ``AuditWriter.extent``).  Read-only.

    ``cursor_offset`` is where a line at or before ``after`` is in this file (the last page's cursor): it
    is checked, and the page starts there; without one (or another node's) the file is read from its
    start, a page at a time, until the lines after ``after``.  The file's lines are in Raft order (the
    writer skips an index it has), so a line is "after" the cursor by its (raft index, position)."""
    blocks: list[dict] = []
    gaps: list[list[int]] = []
    after = (after[0], after[1])
    with open(path, "rb") as f:
        start = 0
        if 0 <= cursor_offset < end:
            line = _line_at(f, path, cursor_offset, end)
            if line is not None and _key(line.entry) <= after:
                start = cursor_offset
        f.seek(start)
        cursor = (*after, start if start else -1)
        prev_index = 0  # the Raft index of the line before (a trail that starts with a gap: from 0)
        pos, read, more = start, 0, False
        while True:
            # Two lines at least (the first may be the cursor's own, read again): each page moves on.
            if len(blocks) >= limit or (read > 1 and pos - start >= max_bytes):
                more = pos < end
                break
            if pos + _FRAME.size > end:
                break
            length, crc = _FRAME.unpack(f.read(_FRAME.size))
            stop = pos + _FRAME.size + length
            if stop > end:
                break  # not whole in the part of the file written up to ``last_index``
            body = f.read(length)
            if len(body) != length or zlib.crc32(body) != crc:
                raise CorruptFileError(path, f"checksum mismatch in audit line at offset {pos}")
            line = _decode_line(path, body, pos)
            if line.entry.raft_index > last_index:
                break
            key = _key(line.entry)
            if key > after:
                if isinstance(line.entry, AuditGap):
                    gaps.append([prev_index, line.entry.raft_index])
                else:
                    block = _block(line)
                    if block is not None and (broker_id is None or block["broker_id"] == broker_id):
                        blocks.append(block)
                cursor = (*key, pos)
            else:
                cursor = (*after, pos)  # a line at or before the cursor: the next page may start here
            prev_index = line.entry.raft_index
            pos, read = stop, read + 1
    return BlockPage(blocks, gaps, cursor, more)
