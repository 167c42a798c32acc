"""One process per data directory: an exclusive ``flock`` on ``DIR/.lock``, held for the life of the process.

Two processes writing the same partition logs and producer state is how records are duplicated and
lost; Kafka's log directories hold a ``.lock`` for the same reason.  ``lock_directory`` takes the lock
before anything in the directory is read or written and writes the holder's pid into the file, so that
a second process is refused with one line naming the directory and that pid (``DirectoryLockedError``).
The kernel drops a ``flock`` when its holder exits, however it exits: a crash leaves no stale lock, only
a stale pid in the file, which the next holder overwrites.  The lock is advisory (only processes that
take it are kept out) and ``flock`` does not reach across NFS mounts on every system.
"""
from __future__ import annotations

import errno
import fcntl
import os

LOCK_FILE = ".lock"


class DirectoryLockedError(OSError):
    """Another process holds the directory's lock."""

    def __init__(self, directory: str, holder: int | None):
        who = f"pid {holder}" if holder is not None else "a process whose pid is not known"
        super().__init__(errno.EWOULDBLOCK, f"the data directory {directory} is in use by another process ({who})")
        self.directory = directory
        self.holder = holder

    def __str__(self) -> str:
        return self.strerror


class DirectoryLock:
    """The held lock: ``release()`` (or the process's exit) lets another process take it."""

    def __init__(self, directory: str, fd: int):
        self.directory = directory
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # drops the flock; the file stays (removing it would race with the next holder)

    def __enter__(self) -> "DirectoryLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def lock_directory(directory: str) -> DirectoryLock:
    """Create ``directory`` if needed and take its lock, or raise ``DirectoryLockedError`` at once (never
    waits).  The file descriptor is not inherited by child processes (Python's default, O_CLOEXEC)."""
    directory = os.path.abspath(directory)
    os.makedirs(directory, exist_ok=True)
    fd = os.open(os.path.join(directory, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise DirectoryLockedError(directory, holder) from None
    except BaseException:
        os.close(fd)
        raise
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return DirectoryLock(directory, fd)


def _holder(fd: int) -> int | None:
    """The pid the holder wrote (None: not written yet, or not a pid)."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None


__all__ = ["DirectoryLock", "DirectoryLockedError", "LOCK_FILE", "lock_directory"]
