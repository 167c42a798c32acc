"""Append-only files of checksummed msgpack frames, the broker's one layout for small durable tables that
change by entries (producer-ID bindings, consumer groups): ``MAGIC | frame*``, a frame being
``u32 length | u32 crc32(body) | msgpack list of entries`` (little-endian).

What a crash can leave, and what a reader does with it (``decode_frames``):

- a file shorter than its magic, a prefix of it: empty (the creation was cut);
- a last frame cut short, or whose checksum fails with nothing but it (or zeros) after it: the unsynced end
  of an append that was never acknowledged; cut off;
- a bad checksum with a whole frame after it, or an entry the checker refuses: ``CorruptFileError`` (not
  something a crash makes; never guessed around).

Appends are fsync'd before anything they carry is acknowledged; a rewrite replaces the whole file
(``Disk.write_file``: temporary file, fsync, rename, fsync of the directory).
"""
from __future__ import annotations

import logging
import struct
import zlib
from typing import Any, Callable

import msgpack

from snapshots.storage.disk import CorruptFileError

log = logging.getLogger(__name__)

FRAME = struct.Struct("<II")
ENTRIES_PER_FRAME = 65_536


def encode_frames(entries: list) -> bytes:
    """``entries`` as frames of at most ``ENTRIES_PER_FRAME`` entries each."""
    out = bytearray()
    for i in range(0, len(entries), ENTRIES_PER_FRAME):
        raw = msgpack.packb(entries[i:i + ENTRIES_PER_FRAME], use_bin_type=True)
        out += FRAME.pack(len(raw), zlib.crc32(raw)) + raw
    return bytes(out)


def decode_frames(path: str, data: bytes, magic: bytes, what: str,
                  check: Callable[[Any], None]) -> tuple[list, int]:
    """(entries in file order, bytes to keep) of a frame file; a torn last frame is left out (the bytes to
    keep end before it; -1: not even the magic is whole).  ``check`` raises ValueError or TypeError on an
    entry it refuses (then the file is corrupt: its checksum passed, so a writer wrote it)."""
    if not data.startswith(magic):
        if len(data) < len(magic) and magic.startswith(data):
            return [], -1
        raise CorruptFileError(path, f"not a {what} (bad magic)")
    pos, entries = len(magic), []
    while pos < len(data):
        if len(data) - pos < FRAME.size:
            break  # a frame header cut by a crash
        length, crc = FRAME.unpack_from(data, pos)
        body = data[pos + FRAME.size:pos + FRAME.size + length]
        last = pos + FRAME.size + length >= len(data)
        if len(body) < length or length == 0 or zlib.crc32(body) != crc:
            if len(body) < length or last or not any(data[pos:]):
                break  # the unsynced end of an append (never acknowledged): cut
            raise CorruptFileError(path, f"frame at byte {pos}: checksum mismatch with {len(data) - pos} bytes "
                                         f"after it (not a write cut by a crash)")
        try:
            frame = msgpack.unpackb(body, raw=False)
            if not isinstance(frame, list):
                raise ValueError(f"a frame of type {type(frame).__name__}, not a list")
            for e in frame:
                check(e)
        except (ValueError, TypeError, msgpack.UnpackException) as err:  # checksum passed: a writer bug
            raise CorruptFileError(path, f"frame at byte {pos}: undecodable: {err}") from None
        entries.extend(frame)
        pos += FRAME.size + length
    return entries, pos


class FrameFile:
    """One frame file on a ``Disk``: loaded whole at start (a torn last frame cut off), appended to with an
    fsync per call, rewritten whole.  Blocking: the owner calls it from its I/O thread.  The one write
    discipline of the broker's small tables; what each crash state leaves is in this module's docstring."""

    def __init__(self, path: str, magic: bytes, what: str, check: Callable[[Any], None], disk: Any):
        self.path, self.magic, self.what, self.check, self.disk = path, magic, what, check, disk
        self.file = None  # the Disk's AppendFile once loaded
        self.entries = 0  # entries the file holds (for the owner's rewrite rule)

    def load(self) -> list:
        """The entries in file order; the file is created (magic only) if missing or if its creation was
        cut, its torn end is cut off, and it is left open for appends."""
        data = self.disk.read(self.path)
        entries: list = []
        keep = len(self.magic)
        if data is None:
            self.disk.write_file(self.path, self.magic)
        else:
            entries, keep = decode_frames(self.path, data, self.magic, self.what, self.check)
            if keep < 0:
                self.disk.write_file(self.path, self.magic)
                keep = len(self.magic)
            elif keep < len(data):
                log.warning("%s: %d bytes after byte %d are a write cut by a crash (never acknowledged); cut off",
                            self.path, len(data) - keep, keep)
        self.file = self.disk.open_append(self.path, keep)
        if data is not None and 0 <= keep < len(data):
            self.file.truncate(keep)
        self.entries = len(entries)
        return entries

    def append(self, rows: list) -> None:
        """``rows`` at the end, fsync'd before this returns (an I/O error: the Disk's fail-stop)."""
        self.file.write(encode_frames(rows))
        self.file.sync()
        self.entries += len(rows)

    def rewrite(self, rows: list) -> None:
        """The file replaced by ``rows`` (whole: temporary file, fsync, rename, fsync of the directory);
        appends go on at its end."""
        data = self.magic + encode_frames(rows)
        self.disk.write_file(self.path, data)
        if self.file is not None:
            self.file.close()
        self.file = self.disk.open_append(self.path, len(data))
        self.entries = len(rows)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
