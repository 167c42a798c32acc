"""Simulated time, and the seams through which pysyncobj is made to read it.

pysyncobj reads its clock and its election jitter from module globals
(``pysyncobj.syncobj.monotonicTime`` and ``pysyncobj.syncobj.random``); the adapter
reads the same clock (``quorum.raft._clock``).  ``patched`` replaces both for the
length of a simulation, so every timer and every random draw of every node comes
from the simulation's clock and its seeded generator.  pidquorum's own code takes
its clock by injection (``Service(clock=...)``), never by a switch.
"""
from __future__ import annotations

import contextlib
import random
import threading

import pysyncobj.syncobj as _syncobj

EPOCH = 1_800_000_000.0  # what time.time() reads at simulated second 0 (any fixed value works)


class SimClock:
    """A clock that moves only when the simulation says so; has the ``time`` module's two readers."""

    def __init__(self, start: float = 0.0):
        self.now = start

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return EPOCH + self.now

    def perf_counter(self) -> float:
        return self.now


_lock = threading.Lock()


@contextlib.contextmanager
def patched(clock: SimClock, rng: random.Random):
    """pysyncobj reads ``clock`` and draws its election timeouts from ``rng`` inside the block.
    One simulation at a time per process (the globals are shared)."""
    if not _lock.acquire(blocking=False):
        raise RuntimeError("a simulation is already running in this process")
    saved = (_syncobj.monotonicTime, _syncobj.random)
    _syncobj.monotonicTime = clock.monotonic
    _syncobj.random = rng
    try:
        yield
    finally:
        _syncobj.monotonicTime, _syncobj.random = saved
        _lock.release()
