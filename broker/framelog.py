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

import struct
import zlib
from typing import Any, Callable

import msgpack

from snapshots.storage.disk import CorruptFileError

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
