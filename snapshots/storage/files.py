"""Durable file helpers over ``snapshots.storage.disk`` (one write discipline), and sealed small files."""
from __future__ import annotations

import struct
import zlib

import msgpack

from .disk import CorruptFileError, Disk


def _raise(code: int, message: str) -> None:
    """A failstop that does not stop: ``Disk`` then raises ``StorageFailure`` (an OSError)."""


_DISK = Disk(failstop=_raise)


def fsync_dir(path: str) -> None:
    _DISK.sync_dir(path)


def atomic_write(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that after a crash it holds the old or the new bytes, whole:
    ``snapshots.storage.disk.Disk.write_file`` (temp file, fsync, rename, fsync of the directory), raising
    ``StorageFailure`` (an OSError) on an I/O error instead of stopping the process.  For files outside a
    quorum node's durable path (broker, CLI, exports); a node writes through its own ``Disk``."""
    _DISK.write_file(path, data)


def read_whole(path: str) -> bytes:
    """A small file's bytes; a file that cannot be read is a CorruptFileError ("cannot read: ...")."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise CorruptFileError(path, f"cannot read: {e.strerror}") from None


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
