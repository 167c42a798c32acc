"""Durable file helpers: atomic replace with fsync of the file and its directory."""
from __future__ import annotations

import os
import struct
import zlib

import msgpack


def fsync_dir(path: str) -> None:
    fd = os.open(path or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_synced(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` (created or truncated) and fsync it; no rename."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that after a crash it holds the old or the new bytes, whole.

    temp file, fsync, rename, fsync of the directory.
    """
    tmp = f"{path}.tmp.{os.getpid()}"
    write_synced(tmp, data)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


# ------------------------------------------------------------------ sealed files
# One layout for every small checksummed file (raft snapshot, producer-state
# snapshot, topic metadata): MAGIC | u32 length | msgpack body | u32 crc32(body),
# little-endian.  The magic names the kind of file (and its layout version).
_LEN = struct.Struct("<I")


def seal(magic: bytes, body: dict) -> bytes:
    """The bytes of a sealed file holding the msgpack map ``body``."""
    raw = msgpack.packb(body, use_bin_type=True)
    return magic + _LEN.pack(len(raw)) + raw + _LEN.pack(zlib.crc32(raw))


def unseal(path: str, data: bytes, magic: bytes, what: str) -> dict:
    """The map in a sealed file, or CorruptFileError naming ``path`` and the problem.

    ``what`` names the kind of file in messages ("snapshot", "topic metadata file" ...).
    A file whose checksum passes but whose body is not a map is refused too.
    """
    from .errors import CorruptFileError

    start = len(magic) + _LEN.size
    if len(data) < start + _LEN.size:
        raise CorruptFileError(path, f"truncated {what} ({len(data)} bytes)")
    if not data.startswith(magic):
        raise CorruptFileError(path, f"not a {what} (bad magic)")
    (length,) = _LEN.unpack_from(data, len(magic))
    if start + length + _LEN.size != len(data):
        raise CorruptFileError(path, f"truncated or padded {what}: header says {length} body bytes, "
                                     f"file has {len(data) - start - _LEN.size}")
    raw = data[start:start + length]
    if zlib.crc32(raw) != _LEN.unpack_from(data, start + length)[0]:
        raise CorruptFileError(path, "checksum mismatch")
    try:
        obj = msgpack.unpackb(raw, raw=False)
    except (ValueError, TypeError, msgpack.UnpackException) as e:  # checksum passed: a writer bug; refuse anyway
        raise CorruptFileError(path, f"undecodable body: {e}") from None
    if not isinstance(obj, dict):
        raise CorruptFileError(path, f"unsupported {what} format: a body of type {type(obj).__name__}, not a map")
    return obj
