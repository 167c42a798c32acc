"""``SimDisk``: the production ``snapshots.storage.disk.Disk`` over a simulated file system (``chaos.sim.fs.SimFS``).

The simulator and the crash-state explorer run a node's real write discipline (temp file, fsync, rename,
directory fsync; append files, preallocation, fail-stop on I/O errors); only the system calls under it are
simulated.  ``SimDisk`` adds what the simulation needs around the file system: the faults it arms (``fail``,
``stop``, ``capacity``, all the file system's), the operations record (``ops``, ``on_op``), and the disks
a crash, a power loss or each crash state of one instant leave (``crash``, ``power_loss``, ``crash_states``),
each a new ``SimDisk`` over the file system that survived.
"""
from __future__ import annotations

from typing import Iterator

from snapshots.storage.disk import Disk, FailStop

from .fs import SYNCS, LossPolicy, MachineStopped, Op, SimFS

PREALLOCATE = 256  # SimDisk's preallocation step: files grow every few entries, as the real ones every few thousand


class NodeHalted(BaseException):
    """A node fail-stopped (``failstop`` in a simulated node): the code and the reason it gave."""

    def __init__(self, code: int, message: str):
        super().__init__(code, message)
        self.code, self.message = code, message


def halting_failstop(code: int, message: str):
    raise NodeHalted(code, message)


def _forward(name: str) -> property:
    """An attribute of the simulated file system, read and set through the disk."""
    return property(lambda self: getattr(self.fs, name), lambda self, value: setattr(self.fs, name, value),
                    doc=f"``SimFS.{name}`` of this disk's file system")


class SimDisk(Disk):
    """``Disk`` over ``fs`` (a new, empty ``SimFS`` by default).  Paths are absolute; ``make_dir`` creates
    directories (``/`` exists)."""

    def __init__(self, failstop: FailStop = halting_failstop, preallocate: int = PREALLOCATE, fs: SimFS | None = None):
        self.fs = fs if fs is not None else SimFS()
        super().__init__(failstop, preallocate, os_module=self.fs)

    fail = _forward("fail")          # (op) -> an OSError for that operation to raise, or None
    stop = _forward("stop")          # (op, "before"|"after") -> stop the machine there?
    stopped = _forward("stopped")    # the machine stopped: every further operation raises MachineStopped
    capacity = _forward("capacity")  # bytes; a write past it fails with ENOSPC
    on_op = _forward("on_op")        # called with each operation as it is recorded

    @property
    def ops(self) -> list[Op]:
        return self.fs.ops

    def used(self) -> int:
        return self.fs.used()

    # ------------------------------------------------------------- crashes
    def _over(self, fs: SimFS) -> "SimDisk":
        return SimDisk(self.failstop, self.preallocate, fs)

    def clone(self) -> "SimDisk":
        """An exact copy, pending changes included (to enumerate its crash states later)."""
        return self._over(self.fs.clone())

    def crash(self) -> "SimDisk":
        """The disk as a new process finds it after a process crash: every change kept, unsynced ones still
        unsynced (``SimFS.crash``)."""
        return self._over(self.fs.crash())

    def copy(self) -> "SimDisk":
        """A backup of the disk: every file as a reader sees it now, all durable (``SimFS.copy``)."""
        return self._over(self.fs.copy())

    def power_loss(self, policy: LossPolicy | None = None) -> "SimDisk":
        """The disk after a power loss (default: every unsynced change lost)."""
        return self._over(self.fs.power_loss(policy))

    def crash_states(self, limit: int | None = None) -> Iterator[tuple[str, "SimDisk"]]:
        """The distinct disks a power loss at this instant can leave, labelled (``SimFS.crash_states``)."""
        for label, fs in self.fs.crash_states(limit):
            yield label, self._over(fs)

    def fingerprint(self) -> tuple:
        return self.fs.fingerprint()

    # ------------------------------------------------------------- reading
    def files(self, directory: str) -> dict[str, bytes]:
        """name -> bytes of the files in ``directory`` (what a reader sees now)."""
        return self.fs.files(directory)

    def listdir(self, directory: str) -> list[str]:
        try:
            return self.fs.listdir(directory)
        except FileNotFoundError:
            return []


__all__ = ["LossPolicy", "MachineStopped", "NodeHalted", "Op", "PREALLOCATE", "SYNCS", "SimDisk",
           "halting_failstop"]
