"""Live figures kept by the processes themselves (no Prometheus here).

A ``Histogram`` is what a latency is counted into: the metrics endpoint
(``quorum.metrics``) and ``pidctl ... status`` both read its ``snapshot()``,
so they show the same numbers and nothing is counted twice.
"""
from __future__ import annotations

import bisect
import math
import threading

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
