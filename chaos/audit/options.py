"""What one audit run is asked (``Options``, with the defaults) and how its phases are timed (``Timer``,
``PHASES``): read by the job (``chaos.audit.job``) and the checks (``chaos.audit.checks``) alike."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

EXAMPLES = 10
WINDOW_MS = 60_000
RESTART_REGISTRATIONS = 3   # registrations of one broker in one window that look like a restart loop
RESTART_EPOCHS = 3          # distinct broker epochs in one window's allocations
RATE_FACTOR = 10.0          # a window this many times the fleet's median rate...
RATE_MIN_BLOCKS = 10        # ...and at least this many blocks


@dataclass
class Options:
    examples: int = EXAMPLES
    window_ms: int = WINDOW_MS
    buckets: int | None = None            # force the number of ID-space buckets (tests)
    restart_registrations: int = RESTART_REGISTRATIONS
    restart_epochs: int = RESTART_EPOCHS
    rate_factor: float = RATE_FACTOR
    rate_min_blocks: int = RATE_MIN_BLOCKS
    id_spaces: str = "cluster"            # "cluster": cluster and node sources share one; "source": one each


# The phases of a run, in order, as the timer names them when they end (``Timer.lap``), with what a
# person watching is told while each runs (``run_audit(progress=...)``).  Without blocks the three
# block passes are skipped.
PHASES = (
    ("validate", "reading inputs (manifest, Parquet footers)"),
    ("spark_start", "starting Spark"),
    ("carry_pass", "Spark job: blocks per bucket"),
    ("main_pass", "Spark job: ordered scan for overlaps"),
    ("block_results", "checks: overlaps and gaps"),
    ("boundary", "checks: migration boundary"),
    ("duplicate_pids", "checks: duplicate PIDs"),
    ("brokers", "checks: broker rates and restart loops"),
    ("projection", "checks: ID-space projection"),
    ("write", "writing the report and charts"),
)


class Timer:
    """Seconds per phase of a run (the report's ``timing_s``).  ``progress``: called with the index in
    ``PHASES`` and the description of the phase that starts, when a run starts and after each lap."""

    def __init__(self, progress: Callable[[int, str], None] | None = None):
        self.t0 = time.monotonic()
        self.last = self.t0
        self.phases: dict[str, float] = {}
        self.progress = progress
        self._announce(0)

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.phases[name] = round(now - self.last, 3)
        self.last = now
        names = [n for n, _ in PHASES]
        if name in names:
            self._announce(names.index(name) + 1)

    def _announce(self, index: int) -> None:
        if self.progress is not None and index < len(PHASES):
            self.progress(index, PHASES[index][1])
