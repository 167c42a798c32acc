"""Every durable file operation of a quorum node, in one place, under one write discipline.

Whole files are replaced (temp file, fsync, rename, fsync the directory); append files count as durable
only once synced, and the Raft journal's are preallocated; every I/O error is fail-stop.  The files and
the crash states of each: docs/durability.md, "One write discipline".

``Disk`` makes every system call through ``self.os`` (the ``os`` module unless given another object with
the same calls), so the simulator and the crash-state explorer run this discipline on a simulated file
system (``chaos/sim/fs.py``) rather than a copy of it; production code never looks for a switch.
"""
from __future__ import annotations

import errno as _errno
import logging
import os
import stat as _stat
import sys
from typing import Callable, NoReturn

log = logging.getLogger(__name__)

# Process exit codes of a node (sysexits.h names; the systemd unit lists which are not restarted).
EXIT_CORRUPT = 66        # EX_DATAERR-ish: a damaged or inconsistent data file; needs an operator
EXIT_UNAVAILABLE = 69    # EX_UNAVAILABLE: cannot start (port taken, missing directory ...)
EXIT_SOFTWARE = 70       # EX_SOFTWARE: an unexpected error in a Raft tick or handler; state may be half-changed
EXIT_STORAGE = 74        # EX_IOERR: an I/O error or a full disk on the durable path
EXIT_DIVERGED = 75       # a committed entry differs from the leader's: this node's log diverged
EXIT_IDENTITY_REFUSED = 78  # EX_CONFIG: a peer refused this node's identity (another cluster, replaced node)

FailStop = Callable[[int, str], NoReturn]

PREALLOCATE = 1 << 20  # bytes an append file is grown by ahead of its writes (AppendFile.reserve)
READ_CHUNK = 1 << 20  # bytes asked of one read(2) while reading a whole file


def process_failstop(code: int, message: str) -> NoReturn:
    """Stop this process now: log why, flush the logs, ``os._exit(code)`` (no cleanup runs, so
    nothing is written or sent after the failure)."""
    try:
        log.critical("stopping (exit %d): %s", code, message)
        logging.shutdown()
    finally:
        try:
            sys.stderr.flush()
        finally:
            os._exit(code)


class CorruptFileError(Exception):
    """A journal, meta, snapshot or audit file failed its checks; the node refuses to start."""

    def __init__(self, path: str, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


class StorageFailure(OSError):
    """An I/O error on the durable path.  Raised only where ``failstop`` returns (never on a node's
    own files, whose failstop ends the process); a node's code must not catch it and go on."""

    def __init__(self, op: str, path: str, error: OSError):
        self.op, self.path, self.error = op, path, error
        name = _errno.errorcode.get(error.errno or 0, "?")
        reason = "disk full" if error.errno == _errno.ENOSPC else (error.strerror or str(error))
        super().__init__(error.errno, f"{op} {path}: {reason} ({name})")

    def __str__(self) -> str:
        return self.strerror


class AppendFile:
    """An append-only file opened by ``Disk.open_append``: ``write`` at the end, ``sync``, ``truncate``."""

    def __init__(self, disk: "Disk", path: str, fd: int, size: int, allocated: int | None = None):
        self.disk = disk
        self.path = path
        self._fd = fd
        self.size = size  # bytes written (durable or not): where the next write goes
        self.allocated = size if allocated is None else allocated  # the file's length (zeros after size)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Write every byte at the end (a short write is continued where it stopped).  Not durable."""
        view = memoryview(data)
        while view:
            try:
                n = self.disk.os.write(self._fd, view)
            except OSError as e:
                self.disk.io_error("write", self.path, e)
            view = view[n:]
            self.size += n
        self.allocated = max(self.allocated, self.size)

    def reserve(self, end: int) -> None:
        """Make the file at least ``end`` bytes long on stable storage before writes reach ``end``:
        zeros from its length to a multiple of ``disk.preallocate`` at least that far past ``end``,
        then fdatasync (nothing when ``disk.preallocate`` is 0 or the file is long enough).  Where
        the writes go does not move."""
        chunk = self.disk.preallocate
        if not chunk or end <= self.allocated:
            return
        new = (end // chunk + 2) * chunk
        view = memoryview(bytes(new - self.allocated))
        offset = self.allocated
        while view:
            try:
                n = self.disk.os.pwrite(self._fd, view, offset)
            except OSError as e:
                self.disk.io_error("preallocate", self.path, e)
            view = view[n:]
            offset += n
        self.sync()
        self.allocated = new

    def sync(self) -> None:
        """fdatasync: everything written so far is on stable storage when this returns."""
        try:
            self.disk.os.fdatasync(self._fd)
        except OSError as e:
            self.disk.io_error("fdatasync", self.path, e)

    def truncate(self, size: int) -> None:
        """Cut the file to ``size`` bytes, durably (synced before anything is written after it)."""
        sys_ = self.disk.os
        try:
            sys_.ftruncate(self._fd, size)
            sys_.lseek(self._fd, size, os.SEEK_SET)
            sys_.fdatasync(self._fd)
        except OSError as e:
            self.disk.io_error("truncate", self.path, e)
        self.size = self.allocated = size

    def close(self) -> None:
        if self._fd < 0:
            return
        fd, self._fd = self._fd, -1
        try:
            self.disk.os.close(fd)
        except OSError as e:
            self.disk.io_error("close", self.path, e)

class Disk:
    """The real file system, under the discipline above.  ``os_module``: what makes the system calls (the
    ``os`` module; the simulator's file system in ``chaos.sim``)."""

    append_file_class = AppendFile  # what ``open_append`` returns (a fault-injecting disk subclasses both)

    def __init__(self, failstop: FailStop = process_failstop, preallocate: int = PREALLOCATE, os_module=os):
        self.failstop = failstop
        self.preallocate = preallocate  # AppendFile.reserve's step, bytes (0: append files are not preallocated)
        self.os = os_module

    # ---------------------------------------------------------------- errors
    def io_error(self, op: str, path: str, error: OSError) -> NoReturn:
        failure = StorageFailure(op, path, error)
        self.failstop(EXIT_STORAGE, f"I/O error on the durable path, {failure}; nothing more is written or "
                                    f"acknowledged (restart the node once the disk is healthy)")
        raise failure  # only reached where failstop returns (tests, the simulator)

    # ----------------------------------------------------------------- reads
    def read(self, path: str, offset: int = 0) -> bytes | None:
        """The file's bytes from ``offset`` on, or None if there is no such file."""
        sys_ = self.os
        try:
            fd = sys_.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        except OSError as e:
            self.io_error("read", path, e)
        try:
            try:
                if offset:
                    sys_.lseek(fd, offset, os.SEEK_SET)
                chunks = []
                while chunk := sys_.read(fd, READ_CHUNK):
                    chunks.append(chunk)
            finally:
                sys_.close(fd)
        except OSError as e:
            self.io_error("read", path, e)
        return b"".join(chunks)

    def exists(self, path: str) -> bool:
        try:
            self.os.stat(path)
        except (OSError, ValueError):  # as os.path.exists
            return False
        return True

    def _is_dir(self, path: str) -> bool:
        try:
            return _stat.S_ISDIR(self.os.stat(path).st_mode)
        except (OSError, ValueError):  # as os.path.isdir
            return False

    def size(self, path: str) -> int | None:
        try:
            return self.os.stat(path).st_size
        except FileNotFoundError:
            return None
        except OSError as e:
            self.io_error("stat", path, e)

    # ---------------------------------------------------------------- writes
    def make_dir(self, path: str, mode: int = 0o700) -> None:
        """Create ``path`` (and its parents) if missing, durably: each new directory's entry is synced in its
        parent.  ``mode`` 0700 (files are 0600: a node's data is for its own user); missing parents get 0777
        less the umask, as ``os.makedirs`` gives them."""
        path = os.path.abspath(path)
        if self._is_dir(path):
            return
        parent = os.path.dirname(path)
        if parent != path:
            self.make_dir(parent, 0o777)
        try:
            self.os.mkdir(path, mode)
        except FileExistsError as e:
            if self._is_dir(path):  # made meanwhile by another process
                return
            self.io_error("mkdir", path, e)
        except OSError as e:
            self.io_error("mkdir", path, e)
        self.sync_dir(parent)

    def write_file(self, path: str, data: bytes) -> None:
        """Replace ``path`` with ``data``: temp file, fsync, rename, fsync of the directory."""
        sys_ = self.os
        tmp = path + ".tmp"
        try:
            fd = sys_.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        except OSError as e:
            self.io_error("create", tmp, e)
        f = AppendFile(self, tmp, fd, 0)
        try:
            f.write(data)
            try:
                sys_.fsync(fd)
            except OSError as e:
                self.io_error("fsync", tmp, e)
        finally:
            f.close()
        try:
            sys_.replace(tmp, path)
        except OSError as e:
            self.io_error("rename", f"{tmp} -> {path}", e)
        self.sync_dir(os.path.dirname(os.path.abspath(path)))

    def remove(self, path: str) -> None:
        """Unlink ``path`` (if it exists), durably."""
        try:
            self.os.unlink(path)
        except FileNotFoundError:
            return
        except OSError as e:
            self.io_error("unlink", path, e)
        self.sync_dir(os.path.dirname(os.path.abspath(path)))

    def open_append(self, path: str, end: int | None = None) -> AppendFile:
        """An existing file, positioned at ``end`` (what was written of it; the bytes after it, zeros
        of a preallocation, are overwritten) or, by default, at its length."""
        sys_ = self.os
        try:
            fd = sys_.open(path, os.O_RDWR)
        except OSError as e:
            self.io_error("open", path, e)
        try:
            length = sys_.lseek(fd, 0, os.SEEK_END)
            if end is not None and 0 <= end <= length:
                sys_.lseek(fd, end, os.SEEK_SET)
        except OSError as e:
            sys_.close(fd)
            self.io_error("seek", path, e)
        if end is not None and not 0 <= end <= length:
            sys_.close(fd)
            raise ValueError(f"{path}: cannot append at offset {end}: the file has {length} bytes")
        return self.append_file_class(self, path, fd, length if end is None else end, length)

    def sync_dir(self, path: str) -> None:
        sys_ = self.os
        try:
            fd = sys_.open(path or ".", os.O_RDONLY | os.O_DIRECTORY)
        except OSError as e:
            self.io_error("open directory", path, e)
        try:
            sys_.fsync(fd)
        except OSError as e:
            self.io_error("fsync directory", path, e)
        finally:
            sys_.close(fd)
