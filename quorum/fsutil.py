"""Durable file helpers: atomic replace with fsync of the file and its directory."""
from __future__ import annotations

import os


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
