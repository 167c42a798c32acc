"""Asyncio on simulated time: a loop whose clock is the simulation's (``SimLoop``), and one that the
simulation pumps as an event whenever it has work due (``PumpedLoop``: a broker's, a client's)."""
from __future__ import annotations

import asyncio
import selectors

from .clock import SimClock
from .host import Host


class _NoWait(selectors.DefaultSelector):
    """A selector that never blocks: time passes only when the simulation moves its clock."""

    def select(self, timeout=None):
        return super().select(0)


def _creation(task: asyncio.Task) -> int:
    """A task's place in creation order (asyncio names tasks Task-<n> from one counter)."""
    name = task.get_name()
    return int(name[5:]) if name.startswith("Task-") and name[5:].isdigit() else 0


class SimLoop(asyncio.SelectorEventLoop):
    """An asyncio loop whose clock is the simulation's; ``pump`` runs what is due now."""

    def __init__(self, clock: SimClock):
        super().__init__(_NoWait())
        self._sim_clock = clock

    def time(self) -> float:
        return self._sim_clock.now

    def pump(self, limit: int = 1000) -> None:
        asyncio.events._set_running_loop(self)
        try:
            for _ in range(limit):
                due = self._scheduled and self._scheduled[0]._when <= self.time()
                if not self._ready and not due:
                    return
                self._run_once()
        finally:
            asyncio.events._set_running_loop(None)

    def shut(self) -> None:
        for _ in range(10):
            # In the order they were created: ``all_tasks`` is a set (ordered by address), and what a
            # cancelled task's callbacks do next must not depend on where its object happens to live.
            tasks = sorted((t for t in asyncio.all_tasks(self) if not t.done()), key=_creation)
            if not tasks:
                break
            for task in tasks:
                task.cancel()
            self.pump()
        self.close()


class PumpedLoop:
    """A ``SimLoop`` run by the simulation when it has work: an event at once if callbacks are ready, else at
    its next timer.  ``freeze`` holds it; after ``shut`` it never runs again."""

    def __init__(self, sim: Host):
        self.sim = sim
        self.loop = SimLoop(sim.clock)
        self._next: float | None = None
        self.closed = False
        self.frozen = False

    def wake(self) -> None:
        if self.closed:
            return
        loop, now = self.loop, self.sim.clock.now
        when = now if loop._ready else (loop._scheduled[0]._when if loop._scheduled else None)
        if when is not None and (self._next is None or when < self._next):
            self._next = max(when, now)
            self.sim.schedule(self._next, "broker", self._pump, self._next)

    def freeze(self, frozen: bool) -> None:
        """Hold the loop (nothing of it runs) while the quorum converges; then let it go on."""
        self.frozen = frozen
        if not frozen:
            self._next = None
            self.wake()

    def _pump(self, at: float) -> None:
        if self._next != at or self.closed or self.frozen:
            return
        self._next = None
        self.loop.pump()
        self.wake()

    def spawn(self, coro) -> asyncio.Task:
        task = self.loop.create_task(coro)
        self.wake()
        return task

    def shut(self) -> None:
        if not self.closed:
            self.closed = True
            self.loop.shut()
