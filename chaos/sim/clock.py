"""Simulated time, and the seam through which every node of the simulated world reads it.

pysyncobj reads its clock and its election jitter from module globals; ``quorum.raft.driven_by``
replaces both for the length of a simulation, so every timer and every random draw of every node
comes from the simulation's clock and its seeded generator.  pidquorum's own code takes its clock
by injection (``Service(clock=...)``), never by a switch.
"""
from __future__ import annotations

import contextlib
import random

from quorum.raft import driven_by

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


@contextlib.contextmanager
def patched(clock: SimClock, rng: random.Random):
    """Every node reads ``clock`` and draws its election timeouts from ``rng`` inside the block (one
    simulation at a time per process)."""
    with driven_by(clock.monotonic, rng):
        yield
