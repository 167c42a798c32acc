"""pysyncobj's poller on the node's asyncio loop: one thread for Raft and the client port.

``LoopPoller`` has pysyncobj's poller interface and puts each descriptor on the loop; a ready descriptor
calls ``on_ready(handler, descriptor, event)``, where the node runs the handler under its fail-stop and
schedules a tick.  It saves the two thread crossings per entry a Raft thread of its own cost;
``docs/durability.md`` ("One thread for Raft and the client port") has the trade-off.
"""
from __future__ import annotations

import asyncio
from typing import Callable

# pysyncobj's ``POLL_EVENT_TYPE`` (``quorum.raft.upstream``, the one module that imports pysyncobj, checks they agree).
READ, WRITE, ERROR = 1, 2, 4


class LoopPoller:
    """pysyncobj's ``Poller`` on ``loop``.  Used from the loop's thread only (as pysyncobj's is from its
    tick thread)."""

    def __init__(self, loop: asyncio.AbstractEventLoop,
                 on_ready: Callable[[Callable[[int, int], None], int, int], None]):
        self._loop = loop
        self._on_ready = on_ready
        self._subs: dict[int, tuple[Callable[[int, int], None], int]] = {}  # fd -> (handler, mask)

    def subscribe(self, descr: int, callback: Callable[[int, int], None], eventMask: int) -> None:  # noqa: N803
        old = self._subs.get(descr)
        self._subs[descr] = (callback, eventMask)
        try:
            self._register(descr, old[1] if old is not None else 0, eventMask)
        except OSError:
            # A registration of an earlier descriptor with this number, closed before it was unsubscribed: the
            # selector has dropped it on this error.  Register afresh (an error now is the caller's).
            self._drop(descr)
            self._register(descr, 0, eventMask)

    def _register(self, descr: int, old_mask: int, mask: int) -> None:
        reads, read = bool(old_mask & (READ | ERROR)), bool(mask & (READ | ERROR))
        writes, write = bool(old_mask & WRITE), bool(mask & WRITE)
        if read and not reads:
            self._loop.add_reader(descr, self._ready, descr, READ)
        elif reads and not read:
            self._loop.remove_reader(descr)
        if write and not writes:
            self._loop.add_writer(descr, self._ready, descr, WRITE)
        elif writes and not write:
            self._loop.remove_writer(descr)

    def unsubscribe(self, descr: int) -> None:
        if self._subs.pop(descr, None) is not None:
            self._drop(descr)

    def _drop(self, descr: int) -> None:
        """Off the loop, whatever was registered.  pysyncobj closes a connection's socket before it
        unsubscribes it; the kernel has then taken the descriptor out of the selector, and the loop's
        update of it fails (the selector forgets it as it raises)."""
        for remove in (self._loop.remove_reader, self._loop.remove_writer):
            try:
                remove(descr)
            except OSError:
                pass

    def poll(self, timeout: float) -> None:
        """The loop waits for the descriptors: nothing to do here."""

    def _ready(self, descr: int, event: int) -> None:
        sub = self._subs.get(descr)
        if sub is not None:
            self._on_ready(sub[0], descr, event)

    def close(self) -> None:
        """Take every descriptor off the loop (the node is stopping; pysyncobj closes the sockets)."""
        for descr in list(self._subs):
            self.unsubscribe(descr)

    @property
    def descriptors(self) -> int:
        return len(self._subs)
