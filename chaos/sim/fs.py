"""A simulated file system at the level of the system calls ``snapshots.storage.disk.Disk`` makes, with the crash
semantics POSIX allows: what a node's files look like after a process crash or a power loss at any instant.

``SimFS`` offers the ``os`` calls ``Disk`` uses, so the simulator runs the production write discipline
instead of a copy of it.  Changes are visible at once but durable only once synced (a file by
``fsync``/``fdatasync``, a directory entry by a directory fsync); ``crash()``, ``copy()``,
``power_loss(...)`` and ``crash_states()`` derive what survives.  What it models, and its faults, are in
docs/simulation.md, section 1, "The simulated file system".
"""
from __future__ import annotations

import errno
import os
import random
import stat as _stat
from dataclasses import dataclass, field
from typing import Callable, Iterator

SYNCS = ("fsync", "fdatasync")  # a file's data to stable storage (a directory's entries: "sync_dir")
_WRITE_MODES = os.O_WRONLY | os.O_RDWR


class MachineStopped(BaseException):
    """The simulated machine stopped at an operation (not an Exception: nothing may catch it and go on)."""


@dataclass
class Op:
    seq: int
    kind: str       # create write fsync fdatasync truncate rename unlink mkdir rmdir sync_dir read
    path: str
    detail: dict = field(default_factory=dict)

    def __str__(self) -> str:
        extra = " ".join(f"{k}={v}" for k, v in self.detail.items())
        return f"#{self.seq} {self.kind} {self.path} {extra}".rstrip()


class _Inode:
    __slots__ = ("ino", "data", "durable", "pending")

    def __init__(self, ino: int):
        self.ino = ino
        self.data = bytearray()        # what readers see now
        self.durable = b""             # what survives a power loss for sure
        self.pending: list[tuple] = []  # ("write", offset, bytes) | ("truncate", size), since the last sync


DIR = -1  # a directory entry naming a subdirectory (directories are kept by path)


class _Dir:
    __slots__ = ("entries", "durable", "pending")

    def __init__(self):
        self.entries: dict[str, int] = {}   # name -> inode number (DIR for a subdirectory)
        self.durable: dict[str, int] = {}
        self.pending: list[tuple] = []      # ("set", name, ino) | ("del", name) | ("move", old, new, ino)


class _Open:
    """An open file description: an inode (or a directory, by path), how it was opened, its offset."""
    __slots__ = ("inode", "dir", "path", "flags", "pos")

    def __init__(self, inode: _Inode | None, dir_path: str | None, path: str, flags: int):
        self.inode, self.dir, self.path, self.flags, self.pos = inode, dir_path, path, flags, 0


@dataclass(frozen=True)
class StatResult:
    st_mode: int
    st_size: int
    st_ino: int


def _error(code: int, path: str) -> OSError:
    return OSError(code, os.strerror(code), path)  # OSError(ENOENT, ...) is a FileNotFoundError, and so on


class LossPolicy:
    """How much of what was not synced a power loss keeps.

    ``keep``: "none" (only durable state), "all" (every pending change, i.e. a crash), or "random"
    (a prefix drawn from ``rng`` per inode and per directory, the last write torn with probability
    ``torn``)."""

    def __init__(self, keep: str = "none", rng: random.Random | None = None, torn: float = 0.5,
                 garbage: bool = True):
        self.keep, self.rng, self.torn = keep, rng, torn
        self.garbage = garbage  # a torn write leaves garbage (else zeros) where its bytes did not land
        self.current: tuple | None = None  # what is being decided: ("dir", path) or ("inode", ino)

    def prefix(self, n: int) -> int:
        if self.keep == "none" or n == 0:
            return 0
        if self.keep == "all":
            return n
        return self.rng.randint(0, n)

    def tear(self) -> bool:
        return self.keep == "random" and self.rng.random() < self.torn


class _OnlyOne(LossPolicy):
    """Keep ``k`` pending changes of one inode or directory (its last write torn, with ``torn``), none elsewhere."""

    def __init__(self, target: tuple, k: int, torn: bool):
        super().__init__("none", random.Random(k), 1.0, garbage=False)
        self.target, self.k, self.torn_last = target, k, torn

    def prefix(self, n: int) -> int:
        return self.k if self.current == self.target else 0

    def tear(self) -> bool:
        return self.torn_last and self.current == self.target


class SimFS:
    """See the module docstring."""

    def __init__(self):
        self._inodes: dict[int, _Inode] = {}   # every inode some directory names (now, durably or pending)
        self._dirs: dict[str, _Dir] = {"/": _Dir()}
        self._next_ino = 1
        self._fds: dict[int, _Open] = {}
        self._next_fd = 3
        self.ops: list[Op] = []
        self.capacity: int | None = None
        self.fail: Callable[[Op], OSError | None] | None = None
        self.stop: Callable[[Op, str], bool] | None = None  # (op, "before"|"after") -> stop the machine?
        self.stopped = False
        self.on_op: Callable[[Op], None] | None = None

    # ------------------------------------------------------------ internals
    @staticmethod
    def _norm(path: str) -> str:
        path = os.path.normpath(os.fspath(path))
        return path if path.startswith("/") else "/" + path

    def _split(self, path: str) -> tuple[str, str]:
        d, name = os.path.split(path)
        return d or "/", name

    def _op(self, kind: str, path: str, **detail) -> Op:
        """Record an operation about to happen: the machine may stop before it, or a fault be raised instead."""
        if self.stopped:
            raise MachineStopped(f"the machine is stopped ({kind} {path})")
        op = Op(len(self.ops), kind, path, detail)
        if self.stop is not None and self.stop(op, "before"):
            self.stopped = True
            raise MachineStopped(f"stopped before {op}")
        self.ops.append(op)
        if self.on_op is not None:
            self.on_op(op)
        if self.fail is not None:
            error = self.fail(op)
            if error is not None:
                op.detail["error"] = errno.errorcode.get(error.errno, str(error.errno))
                raise error
        return op

    def _after(self, op: Op) -> None:
        if self.stop is not None and self.stop(op, "after"):
            self.stopped = True
            raise MachineStopped(f"stopped after {op}")

    def _fd(self, fd: int) -> _Open:
        f = self._fds.get(fd)
        if f is None:
            raise _error(errno.EBADF, f"fd {fd}")
        return f

    def _file(self, fd: int, writing: bool = False) -> _Open:
        f = self._fd(fd)
        if f.inode is None:
            raise _error(errno.EISDIR, f.path)
        if writing and not f.flags & _WRITE_MODES:
            raise _error(errno.EBADF, f.path)
        return f

    def used(self) -> int:
        return sum(len(i.data) for i in self._inodes.values())

    def _check_space(self, inode: _Inode, end: int, op: Op) -> None:
        extra = end - len(inode.data)
        if self.capacity is not None and extra > 0 and self.used() + extra > self.capacity:
            op.detail["error"] = "ENOSPC"
            raise _error(errno.ENOSPC, op.path)

    def _new_inode(self) -> _Inode:
        inode = _Inode(self._next_ino)
        self._inodes[inode.ino] = inode
        self._next_ino += 1
        return inode

    def _apply_write(self, inode: _Inode, offset: int, data: bytes) -> None:
        if offset > len(inode.data):
            inode.data += bytes(offset - len(inode.data))
        inode.data[offset:offset + len(data)] = data
        inode.pending.append(("write", offset, data))

    def _collect(self) -> None:
        """Forget inodes no directory names now, durably or in a pending change (a power loss cannot bring
        them back).  Open descriptors keep their own reference."""
        named = set()
        for d in self._dirs.values():
            named.update(d.entries.values())
            named.update(d.durable.values())
            for change in d.pending:
                named.add(change[-1])
        for ino in [i for i in self._inodes if i not in named]:
            del self._inodes[ino]

    def _lookup(self, path: str) -> _Inode | None:
        dpath, name = self._split(self._norm(path))
        d = self._dirs.get(dpath)
        ino = d.entries.get(name) if d is not None else None
        return self._inodes.get(ino) if ino is not None and ino != DIR else None

    # ---------------------------------------------------------- the os calls
    def open(self, path: str, flags: int, mode: int = 0o777) -> int:
        if self.stopped:
            raise MachineStopped(f"the machine is stopped (open {path})")
        path = self._norm(path)
        if path in self._dirs:
            if flags & _WRITE_MODES:
                raise _error(errno.EISDIR, path)
            return self._new_fd(_Open(None, path, path, flags))
        if flags & os.O_DIRECTORY:
            raise _error(errno.ENOTDIR if self._lookup(path) is not None else errno.ENOENT, path)
        dpath, name = self._split(path)
        d = self._dirs.get(dpath)
        if d is None:
            raise _error(errno.ENOENT, path)
        ino = d.entries.get(name)
        if ino is None and not flags & os.O_CREAT:
            raise _error(errno.ENOENT, path)
        if ino is not None and flags & os.O_CREAT and flags & os.O_EXCL:
            raise _error(errno.EEXIST, path)
        if flags & os.O_CREAT:
            op = self._op("create", path)
            if ino is None:
                inode = self._new_inode()
                d.entries[name] = inode.ino
                d.pending.append(("set", name, inode.ino))
            else:
                inode = self._inodes[ino]
                if flags & os.O_TRUNC and inode.data:
                    del inode.data[:]
                    inode.pending.append(("truncate", 0))
            self._after(op)
        else:
            inode = self._inodes[ino]
            if flags & os.O_TRUNC and flags & _WRITE_MODES:
                op = self._op("truncate", path, size=0)
                del inode.data[:]
                inode.pending.append(("truncate", 0))
                self._after(op)
            elif not flags & _WRITE_MODES:
                self._after(self._op("read", path))
        return self._new_fd(_Open(inode, None, path, flags))

    def _new_fd(self, f: _Open) -> int:
        fd, self._next_fd = self._next_fd, self._next_fd + 1
        self._fds[fd] = f
        return fd

    def close(self, fd: int) -> None:
        self._fd(fd)
        del self._fds[fd]

    def read(self, fd: int, n: int) -> bytes:
        f = self._file(fd)
        data = bytes(f.inode.data[f.pos:f.pos + n])
        f.pos += len(data)
        return data

    def lseek(self, fd: int, pos: int, how: int) -> int:
        f = self._fd(fd)
        base = {os.SEEK_SET: 0, os.SEEK_CUR: f.pos,
                os.SEEK_END: len(f.inode.data) if f.inode is not None else 0}.get(how)
        if base is None or base + pos < 0:
            raise _error(errno.EINVAL, f.path)
        f.pos = base + pos
        return f.pos

    def write(self, fd: int, data) -> int:
        f = self._file(fd, writing=True)
        offset = len(f.inode.data) if f.flags & os.O_APPEND else f.pos
        n = self._write(f, data, offset)
        f.pos = offset + n
        return n

    def pwrite(self, fd: int, data, offset: int) -> int:
        return self._write(self._file(fd, writing=True), data, offset)

    def _write(self, f: _Open, data, offset: int) -> int:
        data = bytes(data)
        detail = {"zeros": True} if data and data.count(0) == len(data) else {}  # a preallocation, as a rule
        op = self._op("write", f.path, offset=offset, bytes=len(data), **detail)
        self._check_space(f.inode, offset + len(data), op)
        self._apply_write(f.inode, offset, data)
        self._after(op)
        return len(data)

    def ftruncate(self, fd: int, size: int) -> None:
        f = self._file(fd, writing=True)
        op = self._op("truncate", f.path, size=size)
        self._check_space(f.inode, size, op)
        if size > len(f.inode.data):
            f.inode.data += bytes(size - len(f.inode.data))
        else:
            del f.inode.data[size:]
        f.inode.pending.append(("truncate", size))
        self._after(op)

    def fsync(self, fd: int, kind: str = "fsync") -> None:
        f = self._fd(fd)
        if f.inode is None:
            d = self._dirs.get(f.dir)
            op = self._op("sync_dir", f.dir)
            if d is not None:
                d.durable = dict(d.entries)
                d.pending.clear()
                self._collect()
            self._after(op)
            return
        try:
            op = self._op(kind, f.path)
        except OSError:
            # A failed sync: the kernel marks the dirty pages clean and drops them (Linux, 2018: the
            # PostgreSQL fsync lesson), so the file reads as its last durable content and a later sync
            # succeeds with nothing to write.
            f.inode.data = bytearray(f.inode.durable)
            f.inode.pending.clear()
            raise
        f.inode.durable = bytes(f.inode.data)
        f.inode.pending.clear()
        self._after(op)

    def fdatasync(self, fd: int) -> None:
        self.fsync(fd, "fdatasync")

    def replace(self, src: str, dst: str) -> None:
        src, dst = self._norm(src), self._norm(dst)
        sdir, sname = self._split(src)
        ddir, dname = self._split(dst)
        s, d = self._dirs.get(sdir), self._dirs.get(ddir)
        if s is None or sname not in s.entries or d is None:
            raise _error(errno.ENOENT, src)
        ino = s.entries[sname]
        if ino == DIR or d.entries.get(dname) == DIR:
            raise _error(errno.EISDIR, dst)  # directories are never renamed here
        op = self._op("rename", src, to=dst)
        del s.entries[sname]
        d.entries[dname] = ino
        if s is d:
            d.pending.append(("move", sname, dname, ino))
        else:
            s.pending.append(("del", sname))
            d.pending.append(("set", dname, ino))
        self._after(op)

    rename = replace

    def unlink(self, path: str) -> None:
        path = self._norm(path)
        dpath, name = self._split(path)
        d = self._dirs.get(dpath)
        if d is None or name not in d.entries:
            raise _error(errno.ENOENT, path)
        if d.entries[name] == DIR:
            raise _error(errno.EISDIR, path)
        op = self._op("unlink", path)
        del d.entries[name]
        d.pending.append(("del", name))
        self._after(op)

    def mkdir(self, path: str, mode: int = 0o777) -> None:
        path = self._norm(path)
        dpath, name = self._split(path)
        parent = self._dirs.get(dpath)
        if parent is None:
            raise _error(errno.ENOENT, path)
        if name in parent.entries or path in self._dirs:
            raise _error(errno.EEXIST, path)
        op = self._op("mkdir", path)
        self._dirs[path] = _Dir()
        parent.entries[name] = DIR
        parent.pending.append(("set", name, DIR))
        self._after(op)

    def rmdir(self, path: str) -> None:
        path = self._norm(path)
        d = self._dirs.get(path)
        if d is None or path == "/":
            raise _error(errno.ENOENT if d is None else errno.EBUSY, path)
        if d.entries:
            raise _error(errno.ENOTEMPTY, path)
        op = self._op("rmdir", path)
        parent_path, name = self._split(path)
        parent = self._dirs[parent_path]
        del self._dirs[path]
        del parent.entries[name]
        parent.pending.append(("del", name))
        self._after(op)

    def stat(self, path: str) -> StatResult:
        path = self._norm(path)
        if path in self._dirs:
            return StatResult(_stat.S_IFDIR | 0o700, 0, 0)
        inode = self._lookup(path)
        if inode is None:
            raise _error(errno.ENOENT, path)
        return StatResult(_stat.S_IFREG | 0o600, len(inode.data), inode.ino)

    def fstat(self, fd: int) -> StatResult:
        f = self._fd(fd)
        if f.inode is None:
            return StatResult(_stat.S_IFDIR | 0o700, 0, 0)
        return StatResult(_stat.S_IFREG | 0o600, len(f.inode.data), f.inode.ino)

    def listdir(self, path: str) -> list[str]:
        d = self._dirs.get(self._norm(path))
        if d is None:
            raise _error(errno.ENOENT, path)
        return sorted(d.entries)

    # ------------------------------------------------------------- crashes
    def clone(self) -> "SimFS":
        """An exact copy, pending changes included (to enumerate its crash states later); no descriptors."""
        out = SimFS()
        out._next_ino = self._next_ino
        for ino, inode in self._inodes.items():
            new = _Inode(ino)
            new.data, new.durable, new.pending = bytearray(inode.data), inode.durable, list(inode.pending)
            out._inodes[ino] = new
        for path, d in self._dirs.items():
            nd = _Dir()
            nd.entries, nd.durable, nd.pending = dict(d.entries), dict(d.durable), list(d.pending)
            out._dirs[path] = nd
        return out

    def crash(self) -> "SimFS":
        """The file system as a new process finds it after a process crash (kill -9): every change kept,
        and what was unsynced still unsynced (the page cache survives the process, not a power loss)."""
        return self.clone()

    def copy(self) -> "SimFS":
        """A copy of the files as a reader sees them now, all durable (a backup, written and synced by the
        copying tool)."""
        return self.image(LossPolicy("all"))

    def power_loss(self, policy: LossPolicy | None = None) -> "SimFS":
        """The file system after a power loss (default: every unsynced change lost)."""
        return self.image(policy or LossPolicy("none"))

    def image(self, policy: LossPolicy) -> "SimFS":
        """A new file system holding what ``policy`` lets survive: per directory, then per inode, the policy
        is told which one it decides for (``policy.current``) and asked how many pending changes to keep."""
        out = SimFS()
        out._next_ino = self._next_ino
        for path, d in self._dirs.items():
            policy.current = ("dir", path)
            entries = dict(d.durable)
            for change in d.pending[:policy.prefix(len(d.pending))]:
                if change[0] == "set":
                    entries[change[1]] = change[2]
                elif change[0] == "del":
                    entries.pop(change[1], None)
                else:
                    entries.pop(change[1], None)
                    entries[change[2]] = change[3]
            nd = _Dir()
            nd.entries, nd.durable = entries, dict(entries)
            out._dirs[path] = nd
        # a directory whose own entry did not survive is gone, with what it holds
        for path in sorted(out._dirs, key=len):
            if path == "/":
                continue
            parent, name = self._split(path)
            if parent not in out._dirs or out._dirs[parent].entries.get(name) != DIR:
                out._dirs.pop(path, None)
        named = {ino for d in out._dirs.values() for ino in d.entries.values()}
        for ino, inode in self._inodes.items():
            policy.current = ("inode", ino)
            data = bytearray(inode.durable)
            keep = policy.prefix(len(inode.pending))
            for i, change in enumerate(inode.pending[:keep]):
                if change[0] == "truncate":
                    if change[1] > len(data):
                        data += bytes(change[1] - len(data))
                    del data[change[1]:]
                    continue
                _, offset, blob = change
                if i == keep - 1 and len(blob) > 1 and policy.tear():
                    cut = policy.rng.randint(1, len(blob) - 1)
                    rest = len(blob) - cut
                    blob = blob[:cut] + (policy.rng.randbytes(rest) if policy.garbage else bytes(rest))
                if offset > len(data):
                    data += bytes(offset - len(data))
                data[offset:offset + len(blob)] = blob
            if ino in named:
                new = _Inode(ino)
                new.data, new.durable = data, bytes(data)
                out._inodes[ino] = new
        return out

    def crash_states(self, limit: int | None = None) -> Iterator[tuple[str, "SimFS"]]:
        """The distinct file systems a power loss at this instant can leave, each with a label: every unsynced
        change lost; then, for each inode and each directory on its own, every prefix of its pending
        changes kept (an inode's last kept write also torn); then everything kept (a process crash).
        Deterministic: the same file system gives the same states in the same order."""
        seen: set = set()
        emitted = 0
        candidates: list[tuple[str, LossPolicy]] = [("all unsynced changes lost", LossPolicy("none"))]
        for ino, inode in sorted(self._inodes.items()):
            name = self._name_of(ino)
            for k in range(1, len(inode.pending) + 1):
                candidates.append((f"{name}: {k} of {len(inode.pending)} pending writes kept",
                                   _OnlyOne(("inode", ino), k, torn=False)))
                change = inode.pending[k - 1]
                if change[0] == "write" and len(change[2]) > 1:
                    candidates.append((f"{name}: {k} of {len(inode.pending)} pending writes kept, the last torn",
                                       _OnlyOne(("inode", ino), k, torn=True)))
        for path, d in sorted(self._dirs.items()):
            for k in range(1, len(d.pending) + 1):
                candidates.append((f"directory {path}: {k} of {len(d.pending)} pending entry changes kept",
                                   _OnlyOne(("dir", path), k, torn=False)))
        candidates.append(("every change kept (a process crash)", LossPolicy("all")))
        for label, policy in candidates:
            if limit is not None and emitted >= limit:
                return
            image = self.image(policy)
            key = image.fingerprint()
            if key not in seen:
                seen.add(key)
                emitted += 1
                yield label, image

    def _name_of(self, ino: int) -> str:
        for path, d in self._dirs.items():
            for name, i in d.entries.items():
                if i == ino:
                    return os.path.join(path, name)
        return f"inode {ino} (unlinked)"

    def fingerprint(self) -> tuple:
        """Every file's path and bytes, as a reader sees them now."""
        files = []
        for path, d in sorted(self._dirs.items()):
            for name, ino in sorted(d.entries.items()):
                if ino != DIR:
                    files.append((os.path.join(path, name), bytes(self._inodes[ino].data)))
        return tuple(files)

    def files(self, directory: str) -> dict[str, bytes]:
        """name -> bytes of the files in ``directory`` (what a reader sees now)."""
        d = self._dirs.get(self._norm(directory))
        if d is None:
            return {}
        return {name: bytes(self._inodes[ino].data) for name, ino in sorted(d.entries.items()) if ino != DIR}


__all__ = ["LossPolicy", "MachineStopped", "Op", "SimFS", "StatResult", "SYNCS"]
