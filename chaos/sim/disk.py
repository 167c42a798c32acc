"""An in-memory disk with the crash semantics POSIX allows: what a node's files look like after a
process crash or a power loss at any instant.

``SimDisk`` has the interface of ``storage.disk.Disk`` (a node takes it in place of the
real one) and models what a file system keeps:

* **inodes** hold bytes.  Writes and truncates change the inode at once (what a reader
  sees), but only ``sync`` (fsync / fdatasync) makes them durable.  Until then they are
  *pending*, in the order they were made.
* **directories** map names to inodes.  Creating, renaming or unlinking a name changes the
  directory at once, but only ``sync_dir`` makes it durable; until then the operation is
  pending.  A rename is atomic.

``crash()`` is a process crash (kill -9): every change stays (the page cache survives).
``power_loss(...)`` is the machine losing power: each directory keeps its durable entries
plus some prefix of its pending operations, each inode its durable bytes plus some prefix of
its pending writes, the last of them possibly torn (partly written, the rest zeros or
garbage).  Which prefix is chosen by ``LossPolicy`` (everything lost, everything kept, or
drawn from a seeded generator).  ``crash_states()`` enumerates the states of one instant for
the crash-state explorer.

Faults: ``fail`` makes a chosen operation raise an OSError (EIO, ENOSPC ...; a failed sync also
drops the file's unsynced writes, as Linux does), ``stop``
stops the machine at a chosen operation (before or after it) by raising ``MachineStopped``,
and ``capacity`` turns writes beyond it into ENOSPC.  Every operation is recorded in ``ops``.
"""
from __future__ import annotations

import errno
import os
import random
from dataclasses import dataclass, field
from typing import Callable, Iterator

from storage.disk import FailStop, StorageFailure

PREALLOCATE = 256  # SimDisk's preallocation step: files grow every few entries, as the real ones every few thousand
SYNCS = ("fsync", "fdatasync")  # a file's data to stable storage (directory entries: "sync_dir")


class MachineStopped(BaseException):
    """The simulated machine stopped at an operation (not an Exception: nothing may catch it and go on)."""


class NodeHalted(BaseException):
    """A node fail-stopped (``failstop`` in a simulated node): the code and the reason it gave."""

    def __init__(self, code: int, message: str):
        super().__init__(code, message)
        self.code, self.message = code, message


def halting_failstop(code: int, message: str):
    raise NodeHalted(code, message)


@dataclass
class Op:
    seq: int
    kind: str       # create write fsync fdatasync truncate rename unlink mkdir sync_dir read
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


class _Dir:
    __slots__ = ("entries", "durable", "pending")

    def __init__(self):
        self.entries: dict[str, int] = {}   # name -> inode number (or -1 for a subdirectory)
        self.durable: dict[str, int] = {}
        self.pending: list[tuple] = []      # ("set", name, ino) | ("del", name), since the last sync_dir


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


class SimAppendFile:
    """``storage.disk.AppendFile`` on a ``SimDisk``: writes go at ``size``, which may lie before the
    file's length (zeros of a preallocation, ``reserve``)."""

    def __init__(self, disk: "SimDisk", path: str, inode: _Inode, end: int | None = None):
        self.disk = disk
        self.path = path
        self._inode = inode
        self.size = len(inode.data) if end is None else end
        self.closed = False

    @property
    def allocated(self) -> int:
        return len(self._inode.data)

    def write(self, data) -> None:
        data = bytes(data)
        self.disk._op("write", self.path, offset=self.size, bytes=len(data))
        self.disk._check_space(max(0, self.size + len(data) - len(self._inode.data)), self.path)
        self.disk._apply_write(self._inode, self.size, data)
        self.size += len(data)

    def reserve(self, end: int) -> None:
        chunk = self.disk.preallocate
        if not chunk or end <= len(self._inode.data):
            return
        offset = len(self._inode.data)
        zeros = bytes((end // chunk + 2) * chunk - offset)
        self.disk._op("write", self.path, offset=offset, bytes=len(zeros), zeros=True)
        self.disk._check_space(len(zeros), self.path)
        self.disk._apply_write(self._inode, offset, zeros)
        self.sync()

    def sync(self, kind: str = "fdatasync") -> None:
        self.disk._op(kind, self.path)
        self.disk._sync_inode(self._inode)

    def truncate(self, size: int) -> None:
        self.disk._op("truncate", self.path, size=size)
        self.disk._apply_truncate(self._inode, size)
        self.size = size
        self.disk._op("fdatasync", self.path)
        self.disk._sync_inode(self._inode)

    def close(self) -> None:
        self.closed = True


class SimDisk:
    """See the module docstring.  Paths are absolute-looking strings; directories are created by
    ``make_dir`` (the root exists)."""

    def __init__(self, failstop: FailStop = halting_failstop, preallocate: int = PREALLOCATE):
        self.failstop = failstop
        self.preallocate = preallocate  # as ``Disk.preallocate``; small, so that the simulation grows files often
        self._inodes: dict[int, _Inode] = {}
        self._dirs: dict[str, _Dir] = {"/": _Dir()}
        self._next_ino = 1
        self.ops: list[Op] = []
        self.capacity: int | None = None
        self.fail: Callable[[Op], OSError | None] | None = None
        self.stop: Callable[[Op, str], bool] | None = None  # (op, "before"|"after") -> stop the machine?
        self.stopped = False
        self.on_op: Callable[[Op], None] | None = None

    # ------------------------------------------------------------ internals
    @staticmethod
    def _split(path: str) -> tuple[str, str]:
        path = os.path.normpath(path)
        d, name = os.path.split(path)
        return d or "/", name

    def _dir(self, path: str, create: bool = False) -> _Dir:
        path = os.path.normpath(path) or "/"
        d = self._dirs.get(path)
        if d is None:
            raise FileNotFoundError(errno.ENOENT, "no such directory", path)
        return d

    def _op(self, kind: str, path: str, **detail) -> Op:
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
                if kind in SYNCS:
                    self._drop_dirty(path)
                self._raise(kind, path, error)
        return op

    def _drop_dirty(self, path: str) -> None:
        """A failed fsync: the kernel marks the dirty pages clean and drops them (Linux, 2018: the
        PostgreSQL fsync lesson), so the file reads as its last durable content and a later fsync
        succeeds with nothing to write."""
        inode = self._lookup(path)
        if inode is not None:
            inode.data = bytearray(inode.durable)
            inode.pending.clear()

    def _after(self, op_kind: str) -> None:
        op = self.ops[-1]
        if self.stop is not None and self.stop(op, "after"):
            self.stopped = True
            raise MachineStopped(f"stopped after {op}")

    def _raise(self, kind: str, path: str, error: OSError):
        failure = StorageFailure(kind, path, error)
        self.failstop(74, f"I/O error on the durable path, {failure}")
        raise failure

    def _check_space(self, extra: int, path: str) -> None:
        if self.capacity is not None and self.used() + extra > self.capacity:
            self._raise("write", path, OSError(errno.ENOSPC, "No space left on device"))

    def used(self) -> int:
        return sum(len(i.data) for i in self._inodes.values())

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

    def _apply_truncate(self, inode: _Inode, size: int) -> None:
        del inode.data[size:]
        inode.pending.append(("truncate", size))

    def _sync_inode(self, inode: _Inode) -> None:
        inode.durable = bytes(inode.data)
        inode.pending.clear()
        self._after("sync")

    def _set_entry(self, d: _Dir, name: str, ino: int) -> None:
        d.entries[name] = ino
        d.pending.append(("set", name, ino))

    def _del_entry(self, d: _Dir, name: str) -> None:
        d.entries.pop(name, None)
        d.pending.append(("del", name))

    def _lookup(self, path: str) -> _Inode | None:
        dpath, name = self._split(path)
        d = self._dirs.get(dpath)
        if d is None:
            return None
        ino = d.entries.get(name)
        return self._inodes.get(ino) if ino is not None and ino >= 0 else None

    # --------------------------------------------------- Disk's interface
    def read(self, path: str, offset: int = 0) -> bytes | None:
        inode = self._lookup(path)
        if inode is None:
            if self.stopped:
                raise MachineStopped(f"the machine is stopped (read {path})")
            return None
        self._op("read", path)
        return bytes(inode.data[offset:])

    def exists(self, path: str) -> bool:
        path = os.path.normpath(path)
        return path in self._dirs or self._lookup(path) is not None

    def size(self, path: str) -> int | None:
        inode = self._lookup(path)
        return None if inode is None else len(inode.data)

    def make_dir(self, path: str) -> None:
        path = os.path.normpath(path)
        if path in self._dirs:
            return
        parent, name = self._split(path)
        if parent not in self._dirs:
            self.make_dir(parent)
        self._op("mkdir", path)
        self._dirs[path] = _Dir()
        self._set_entry(self._dirs[parent], name, -1)
        self.sync_dir(parent)

    def write_file(self, path: str, data: bytes) -> None:
        tmp = path + ".tmp"
        dpath, _ = self._split(path)
        d = self._dir(dpath)
        self._op("create", tmp)
        inode = self._new_inode()
        old = d.entries.get(os.path.basename(tmp))
        if old is not None:
            self._del_entry(d, os.path.basename(tmp))
        self._set_entry(d, os.path.basename(tmp), inode.ino)
        self._after("create")
        f = SimAppendFile(self, tmp, inode)
        f.write(data)
        self._after("write")
        f.sync("fsync")
        self._op("rename", tmp, to=path)
        self._del_entry(d, os.path.basename(tmp))
        self._set_entry(d, os.path.basename(path), inode.ino)
        self._after("rename")
        self.sync_dir(dpath)

    def remove(self, path: str) -> None:
        dpath, name = self._split(path)
        d = self._dirs.get(dpath)
        if d is None or name not in d.entries:
            return
        self._op("unlink", path)
        self._del_entry(d, name)
        self._after("unlink")
        self.sync_dir(dpath)

    def open_append(self, path: str, end: int | None = None) -> SimAppendFile:
        inode = self._lookup(path)
        if inode is None:
            self._raise("open", path, FileNotFoundError(errno.ENOENT, "No such file or directory"))
        if end is not None and not 0 <= end <= len(inode.data):
            raise ValueError(f"{path}: cannot append at offset {end}: the file has {len(inode.data)} bytes")
        return SimAppendFile(self, path, inode, end)

    def sync_dir(self, path: str) -> None:
        d = self._dir(path)
        self._op("sync_dir", os.path.normpath(path))
        d.durable = dict(d.entries)
        d.pending.clear()
        self._after("sync_dir")

    # ------------------------------------------------------------- crashes
    def clone(self) -> "SimDisk":
        """An exact copy, pending changes included (to enumerate its crash states later)."""
        out = SimDisk(self.failstop, self.preallocate)
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

    def crash(self) -> "SimDisk":
        """The disk as a new process finds it after a process crash: every change kept."""
        return self._image(LossPolicy("all"))

    def power_loss(self, policy: LossPolicy | None = None) -> "SimDisk":
        """The disk after a power loss (default: every unsynced change lost)."""
        return self._image(policy or LossPolicy("none"))

    def _image(self, policy: LossPolicy) -> "SimDisk":
        """A new disk holding what ``policy`` lets survive: per directory, then per inode, the policy is
        told which one it decides for (``policy.current``) and asked how many pending changes to keep."""
        out = SimDisk(self.failstop, self.preallocate)
        out._next_ino = self._next_ino
        for path, d in self._dirs.items():
            policy.current = ("dir", path)
            entries = dict(d.durable)
            for op in d.pending[:policy.prefix(len(d.pending))]:
                if op[0] == "set":
                    entries[op[1]] = op[2]
                else:
                    entries.pop(op[1], None)
            nd = _Dir()
            nd.entries, nd.durable = dict(entries), dict(entries)
            out._dirs[path] = nd
        # a directory whose own entry did not survive is gone, with what it holds
        for path in sorted(out._dirs, key=len):
            if path == "/":
                continue
            parent, name = self._split(path)
            if parent not in out._dirs or out._dirs[parent].entries.get(name) != -1:
                out._dirs.pop(path, None)
        for ino, inode in self._inodes.items():
            policy.current = ("inode", ino)
            data = bytearray(inode.durable)
            keep = policy.prefix(len(inode.pending))
            for i, op in enumerate(inode.pending[:keep]):
                if op[0] == "truncate":
                    del data[op[1]:]
                    continue
                _, offset, blob = op
                if i == keep - 1 and len(blob) > 1 and policy.tear():
                    cut = policy.rng.randint(1, len(blob) - 1)
                    rest = len(blob) - cut
                    blob = blob[:cut] + (policy.rng.randbytes(rest) if policy.garbage else bytes(rest))
                if offset > len(data):
                    data += bytes(offset - len(data))
                data[offset:offset + len(blob)] = blob
            new = _Inode(ino)
            new.data, new.durable = data, bytes(data)
            out._inodes[ino] = new
        return out

    def crash_states(self, limit: int | None = None) -> Iterator[tuple[str, "SimDisk"]]:
        """The distinct disks a power loss at this instant can leave, each with a label: every unsynced
        change lost; then, for each inode and each directory on its own, every prefix of its pending
        changes kept (an inode's last kept write also torn); then everything kept (a process crash).
        Deterministic: the same disk gives the same states in the same order."""
        seen: set = set()
        emitted = 0

        def fresh(image: "SimDisk") -> bool:
            key = image.fingerprint()
            if key in seen:
                return False
            seen.add(key)
            return True

        candidates: list[tuple[str, LossPolicy]] = [("all unsynced changes lost", LossPolicy("none"))]
        for ino, inode in sorted(self._inodes.items()):
            for k in range(1, len(inode.pending) + 1):
                name = self._name_of(ino)
                candidates.append((f"{name}: {k} of {len(inode.pending)} pending writes kept",
                                   _OnlyOne(("inode", ino), k, torn=False)))
                op = inode.pending[k - 1]
                if op[0] == "write" and len(op[2]) > 1:
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
            image = self._image(policy)
            if fresh(image):
                emitted += 1
                yield label, image

    def _name_of(self, ino: int) -> str:
        for path, d in self._dirs.items():
            for name, i in d.entries.items():
                if i == ino:
                    return os.path.join(path, name)
        return f"inode {ino} (unlinked)"

    def fingerprint(self) -> tuple:
        files = []
        for path, d in sorted(self._dirs.items()):
            for name, ino in sorted(d.entries.items()):
                if ino >= 0:
                    files.append((os.path.join(path, name), bytes(self._inodes[ino].data)))
        return tuple(files)

    # ------------------------------------------------------------- reading
    def files(self, directory: str) -> dict[str, bytes]:
        """name -> bytes of the files in ``directory`` (what a reader sees now)."""
        d = self._dirs.get(os.path.normpath(directory))
        if d is None:
            return {}
        return {name: bytes(self._inodes[ino].data) for name, ino in sorted(d.entries.items()) if ino >= 0}

    def listdir(self, directory: str) -> list[str]:
        d = self._dirs.get(os.path.normpath(directory))
        return sorted(d.entries) if d is not None else []

    def copy_tree(self, src: str, dst: str) -> None:
        """Copy the files under ``src`` to ``dst`` as they are now (a backup restored: everything durable)."""
        src, dst = os.path.normpath(src), os.path.normpath(dst)
        for path in sorted(p for p in self._dirs if p == src or p.startswith(src + "/")):
            target = dst + path[len(src):]
            self.make_dir(target)
            for name, data in self.files(path).items():
                self.write_file(os.path.join(target, name), data)

    def remove_tree(self, path: str) -> None:
        path = os.path.normpath(path)
        for d in sorted((p for p in self._dirs if p == path or p.startswith(path + "/")), key=len, reverse=True):
            for name in list(self._dirs[d].entries):
                if self._dirs[d].entries[name] >= 0:
                    self.remove(os.path.join(d, name))
            self._dirs.pop(d)
            parent, name = self._split(d)
            if parent in self._dirs:
                self._del_entry(self._dirs[parent], name)
                self.sync_dir(parent)
