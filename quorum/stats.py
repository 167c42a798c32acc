"""Live figures kept by the processes themselves (no Prometheus here).

A ``Histogram`` is what a latency is counted into: the metrics endpoint
(``quorum.metrics``) and ``pidctl ... status`` both read its ``snapshot()``,
so they show the same numbers and nothing is counted twice.  ``AllocationCounts``
holds the blocks and IDs committed per broker, in a table of bounded size.
"""
from __future__ import annotations

import bisect
import math
import threading
from typing import Callable

OTHER_BROKERS = "other"  # the entry (and the metrics' broker_id label) of brokers without their own counters
MAX_BROKER_COUNTERS = 1024

# Seconds.  An fdatasync on a good SSD is ~0.1-2 ms; a slow disk or the slow-disk fault reaches 100s of ms.
SYNC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# One AllocateProducerIds on a healthy quorum: a Raft round trip plus fsyncs; a failover takes up to seconds.
REQUEST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Histogram:
    """Fixed-bucket histogram of seconds; ``observe`` may be called from any thread."""

    def __init__(self, buckets: tuple[float, ...] = REQUEST_BUCKETS):
        if list(buckets) != sorted(set(buckets)) or not buckets:
            raise ValueError("buckets must be distinct and increasing")
        self.bounds = tuple(float(b) for b in buckets)
        self._counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, seconds: float) -> None:
        i = bisect.bisect_left(self.bounds, seconds)
        with self._lock:
            self._counts[i] += 1
            self._sum += seconds

    def snapshot(self) -> dict:
        """``{"count", "sum_s", "buckets": [[upper bound, cumulative count], ..., ["+Inf", count]],
        "p50_s", "p99_s"}``; the quantiles are bucket upper bounds (None when empty or in +Inf)."""
        with self._lock:
            counts, total = list(self._counts), self._sum
        cumulative, running = [], 0
        for bound, c in zip(list(self.bounds) + ["+Inf"], counts):
            running += c
            cumulative.append([bound, running])
        return {"count": running, "sum_s": total, "buckets": cumulative,
                "p50_s": _quantile(cumulative, running, 0.5), "p99_s": _quantile(cumulative, running, 0.99)}


def _quantile(cumulative: list, count: int, q: float) -> float | None:
    if count == 0:
        return None
    rank = math.ceil(q * count)
    for bound, c in cumulative:
        if c >= rank:
            return None if bound == "+Inf" else bound
    return None  # pragma: no cover


class AllocationCounts:
    """Blocks and IDs committed per broker, as applied on this node (``pidquorum_allocations_total`` and
    ``pidquorum_allocated_ids_total`` by ``broker_id``), in at most ``limit`` + 1 entries.

    Every broker id that ever allocated would otherwise stay in the table for the life of the process.
    A broker gets its own counters if it is registered in the applied state when its first block is
    counted and the table has room.  When the table is full, the counters of brokers no longer
    registered are folded into one ``"other"`` entry (a broker that registers again later starts from
    zero: a counter reset, which Prometheus' rate() handles); a broker that still finds no room, or
    is not registered, is counted under ``"other"``.  Nothing counted is lost: the sum over the
    entries only grows.  Not thread-safe: the service calls it under its lock.
    """

    def __init__(self, limit: int = MAX_BROKER_COUNTERS):
        self.limit = limit
        self._per_broker: dict[int, list[int]] = {}
        self._other = [0, 0]  # blocks, IDs

    def count(self, broker_id: int, ids: int, registered: Callable[[int], bool]) -> None:
        """One block of ``ids`` IDs committed for ``broker_id``; ``registered(broker)``: in the applied state."""
        entry = self._per_broker.get(broker_id)
        if entry is None:
            if len(self._per_broker) >= self.limit:
                self.fold_unregistered(registered)
            if len(self._per_broker) < self.limit and registered(broker_id):
                entry = self._per_broker[broker_id] = [0, 0]
            else:
                entry = self._other
        entry[0] += 1
        entry[1] += ids

    def fold_unregistered(self, registered: Callable[[int], bool]) -> int:
        """Move the counters of brokers no longer registered into "other"; how many brokers."""
        gone = [b for b in self._per_broker if not registered(b)]
        for b in gone:
            blocks, ids = self._per_broker.pop(b)
            self._other[0] += blocks
            self._other[1] += ids
        return len(gone)

    def __len__(self) -> int:
        return len(self._per_broker) + (1 if self._other[0] else 0)

    def snapshot(self) -> dict[str, dict[str, int]]:
        """``{broker id as str, or "other": {"blocks", "ids"}}``, "other" only once something was folded."""
        out = {str(b): {"blocks": n, "ids": ids} for b, (n, ids) in sorted(self._per_broker.items())}
        if self._other[0]:
            out[OTHER_BROKERS] = {"blocks": self._other[0], "ids": self._other[1]}
        return out
