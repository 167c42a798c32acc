"""pysyncobj's poller on the node's asyncio loop: one thread for Raft and the client port.

pysyncobj waits for its sockets in a poller of its own (``select.poll``), on a thread that only
ticks Raft.  A node process then ran two busy threads besides its sync thread: the asyncio loop that
serves the client port, and the Raft thread.  Every entry crossed between them twice (the proposal
in through pysyncobj's queue and its pipe, the outcome back through ``call_soon_threadsafe`` and the
loop's own pipe), and each crossing waited for the other thread to be scheduled and to take the GIL:
on a loaded host, a large part of a commit's time (docs/benchmarks.md).

``LoopPoller`` has pysyncobj's poller interface (``subscribe``, ``unsubscribe``, ``poll``) and puts
each descriptor on the loop (``add_reader`` / ``add_writer``).  When a descriptor is ready the loop
calls ``on_ready(handler, descriptor, event)``: the node runs pysyncobj's handler under the same
fail-stop as its ticks (an I/O error while a message is handled, a follower's fdatasync, stops the
process; the loop would only log it) and schedules one tick for the pass.  ``poll`` returns at once,
since the loop does the waiting.  Everything pysyncobj does then runs on the loop's thread, between
the client port's own callbacks.

What it costs: what a tick waits for (a follower's fdatasync before it acknowledges, a snapshot
written at compaction) now holds the client port as long, where it held only the Raft thread.  The
client port's requests are short and every write among them waits for Raft anyway; the leader's
own fdatasync stays on the node's sync thread (``journal.SyncThread``).

Descriptors are level-triggered, as with ``select.poll``: a descriptor subscribed for writing is
reported until pysyncobj subscribes it again without WRITE.  An error or hang-up on a descriptor
makes it readable (and writable) for the loop's selector; pysyncobj's read or send then finds the
error and closes the connection, as it does on ``POLLERR``.
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
