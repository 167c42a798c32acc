"""The consumer groups' durable file, ``consumer-groups.log`` in the broker's data directory: the entries of
``broker.groups.state`` in checksummed frames (``broker.framelog``), appended by one writer task with group
commit, and rewritten whole (the live state only) when it has grown to several times that.

An entry is acknowledged (its future resolved) only once its frame is fsync'd; only then is it applied to
``state``, in file order, so that what is read from ``state`` is always what a restart would read back.  An
I/O error stops the process (``process_failstop``): nothing is acknowledged after a failed sync.  Where the
offsets are kept and why: docs/consumer-groups.md.
"""
from __future__ import annotations

import asyncio
import logging
import os
from typing import Any, Callable, Iterator

from snapshots.storage.disk import Disk, process_failstop

from ..framelog import FrameFile
from .state import GroupState, check_entry

log = logging.getLogger(__name__)

FILE_NAME = "consumer-groups.log"
MAGIC = b"PQGRPS\x00\x01"
REWRITE_SLACK = 10_000  # entries the file may hold beyond twice the live ones before it is rewritten


class GroupStore:
    def __init__(self, data_dir: str, run_io: Callable[..., Any] | None = None, *, disk: Disk | None = None):
        self.path = os.path.join(data_dir, FILE_NAME)
        self.state = GroupState()
        self._run_io = run_io
        self._disk = disk or Disk(failstop=process_failstop, preallocate=0)
        self._frames = FrameFile(self.path, MAGIC, "consumer groups file", check_entry, self._disk)
        self._pending: list[tuple[list, asyncio.Future]] = []
        self._writing: list[tuple[list, asyncio.Future]] = []  # the batch being written
        self._wake: asyncio.Event | None = None
        self._writer: asyncio.Task | None = None
        self._closing = False
        self._failed: Exception | None = None  # the write error that stopped the writer (where failstop returned)
        self.counters = {"group_entries_written": 0, "group_syncs": 0, "group_rewrites": 0}

    # ------------------------------------------------------------ open / close
    def open(self) -> None:
        """Load the file (created empty if missing); blocking, at start."""
        entries = self._frames.load()
        for e in entries:
            self.state.apply(e)
        if entries:
            log.info("%s: %d groups, %d committed offsets, %d producers with offsets pending", self.path,
                     len(self.state.groups()), sum(len(o) for o in self.state.offsets.values()),
                     len(self.state.pending_groups))

    def start(self) -> None:
        """The writer task (on the running loop)."""
        self._wake = asyncio.Event()
        self._writer = asyncio.get_running_loop().create_task(self._write_loop())

    async def close(self) -> None:
        """Write what is pending, then close the file."""
        if self._writer is not None:
            self._closing = True
            self._wake.set()
            await self._writer
            self._writer = None
        self._frames.close()

    # ------------------------------------------------------------ writing
    def write(self, entries: list[list]) -> asyncio.Future:
        """Queue ``entries`` (in this order, after every entry queued before); the future resolves once they
        are durable and applied to ``state``.  Queueing is the decision: callers check and queue in one step
        of the event loop, so the file's order is the order of their decisions."""
        fut = asyncio.get_running_loop().create_future()
        if self._failed is not None:
            fut.set_exception(self._failed)
            return fut
        if self._closing or self._wake is None:
            fut.set_exception(ConnectionError("the consumer groups' file is closed"))
            return fut
        self._pending.append((entries, fut))
        self._wake.set()
        return fut

    def queued(self) -> Iterator[list]:
        """The entries queued and not yet applied (being written, then waiting), in order."""
        for entries, _ in self._writing + self._pending:
            yield from entries

    async def _io(self, fn: Callable, *args: Any) -> Any:
        if self._run_io is None:
            return fn(*args)
        return await self._run_io(fn, *args)

    async def _write_loop(self) -> None:
        """The only writer of the file: appends (group commit) and rewrites, one at a time."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch = self._writing = self._pending
            self._pending = []
            if batch:
                rows = [e for entries, _ in batch for e in entries]
                try:
                    await self._io(self._frames.append, rows)
                except Exception as e:  # only where failstop returns (tests): nothing is acknowledged any more
                    self._failed = e
                    for _, fut in batch + self._pending:
                        if not fut.done():
                            fut.set_exception(e)
                    self._pending = []
                    return
                self.counters["group_entries_written"] += len(rows)
                self.counters["group_syncs"] += 1
                for entries, fut in batch:
                    for e in entries:
                        self.state.apply(e)
                    if not fut.done():
                        fut.set_result(None)
                self._writing = []
                if self._frames.entries > 2 * self.state.size() + REWRITE_SLACK:
                    await self._io(self._rewrite, self.state.rows())
            if self._closing and not self._pending:
                return

    def _rewrite(self, rows: list[list]) -> None:
        self._frames.rewrite(rows)
        self.counters["group_rewrites"] += 1
