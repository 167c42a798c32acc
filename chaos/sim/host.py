"""The simulation as its parts (network, nodes, checkers, clients) see it.

Each part is handed the simulation that owns it; typing it with these Protocols instead of ``Simulation``
keeps the imports one way: ``chaos.sim.sim`` imports the parts, never the reverse."""
from __future__ import annotations

import random
from typing import Callable, Protocol

from .clock import SimClock


class Host(Protocol):
    """The clock, the seed's stream, the event queue and the trace."""

    clock: SimClock
    rng: random.Random

    def new_id(self) -> str: ...

    def schedule(self, at: float, kind: str, fn: Callable, *args) -> None: ...

    def after(self, delay: float, kind: str, fn: Callable, *args) -> None: ...

    def note(self, message: str) -> None: ...
