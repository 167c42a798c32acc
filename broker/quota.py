"""KIP-936: limit the new producer IDs each principal starts producing with.  ``ProducerIdQuotaManager.check``
(on Produce, for each producer ID) answers 0 or the milliseconds to wait; per principal a token bucket pays for
IDs not seen before and a time-layered Bloom filter remembers the ones admitted.  The sizes, the memory bound
and why: docs/quota.md.  ``check`` runs on the event loop, ``stats()`` on any thread: both take one lock.  The
quotas come from the quorum through ``broker.quota_poller``.
"""
from __future__ import annotations

import collections
import logging
import math
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterable

from rbloom import Bloom

from .quota_poller import STATS_FILE, QuotaConfigPoller, read_stats  # noqa: F401 - re-exported

log = logging.getLogger(__name__)

PRODUCER_IDS_RATE = "producer_ids_rate"
USER_PREFIX = "User:"
MIN_LAYER_ITEMS = 16
MAX_LAYER_ITEMS = 1 << 20  # a layer of 1M PIDs is ~2.4 MB at the default false-positive rate
DEFAULT_BURST_S = 60.0
_M64 = (1 << 64) - 1


def filter_key(pid: int) -> int:
    """What the filter stores for ``pid``: SplitMix64's finaliser, a bijection on 64 bits that spreads
    consecutive PIDs over the whole range.  rbloom derives its bit positions from ``hash(pid)``, the int itself,
    through an LCG: the consecutive PIDs of a block would land on correlated positions (docs/quota.md)."""
    x = pid & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


@dataclass(frozen=True)
class QuotaWindow:
    """Broker-side window settings (KIP-936's producer.id.quota.window.*)."""

    num: int = 11
    """producer.id.quota.window.num: windows a PID is remembered for."""
    size_s: float = 3600.0
    """producer.id.quota.window.size.seconds: one window (one filter layer)."""
    false_positive_rate: float = 0.001
    """Target chance that a never-seen PID looks seen (passes for free) with the usual number of layers."""
    burst_s: float = DEFAULT_BURST_S
    """The bucket holds ``rate * burst_s`` tokens (new PIDs at once), capped at the window's span."""

    def __post_init__(self) -> None:
        if isinstance(self.num, bool) or not isinstance(self.num, int) or not 1 <= self.num <= 1000:
            raise ValueError(f"producer id quota window num {self.num!r} is not in 1..1000")
        if not (isinstance(self.size_s, (int, float)) and math.isfinite(self.size_s) and 0 < self.size_s <= 7 * 86400):
            raise ValueError(f"producer id quota window size {self.size_s!r} s is not in (0, 604800]")
        if not (isinstance(self.false_positive_rate, float) and 0 < self.false_positive_rate < 0.5):
            raise ValueError(f"false positive rate {self.false_positive_rate!r} is not in (0, 0.5)")
        b = self.burst_s
        if isinstance(b, bool) or not (isinstance(b, (int, float)) and math.isfinite(b) and 0 < b <= 7 * 86400):
            raise ValueError(f"producer id quota burst {self.burst_s!r} s is not in (0, 604800]")

    @property
    def span_s(self) -> float:
        """How long an admitted PID is remembered at least."""
        return self.num * self.size_s

    @property
    def max_layers(self) -> int:
        # Layers alive within one span: filled by count <= 2 * num (admissions <= burst + refill <=
        # 2 * num * layer_items, the burst being capped at the span), opened by time <= num + 1;
        # refreshes are the only way past it.
        return 3 * self.num + 2

    @property
    def layer_false_positive_rate(self) -> float:
        # A lookup probes every layer: num + 1 of them in steady state.
        return self.false_positive_rate / (self.num + 1)

    def layer_items(self, rate: float) -> int:
        return int(min(MAX_LAYER_ITEMS, max(MIN_LAYER_ITEMS, math.ceil(rate * self.size_s))))

    def burst(self, rate: float) -> float:
        """Tokens in a full bucket: new PIDs one principal may start at once.  Capped at the span
        (KIP-599's formula with KIP-936's window), which also keeps the layer bound above true."""
        return max(1.0, rate * min(self.burst_s, self.span_s))


class _Layer:
    __slots__ = ("bloom", "start", "last_add", "count", "capacity")

    def __init__(self, capacity: int, fpp: float, now: float):
        self.bloom = Bloom(capacity, fpp)
        self.capacity = capacity
        self.start = now
        self.last_add = now
        self.count = 0

    @property
    def nbytes(self) -> int:
        return self.bloom.size_in_bits // 8


class LayeredBloomFilter:
    """PIDs seen by one principal in the last ``window.span_s``, in time layers (oldest first)."""

    def __init__(self, window: QuotaWindow, layer_items: int):
        self.window = window
        self.layer_items = layer_items
        self.layers: collections.deque[_Layer] = collections.deque()
        self.dropped_early = 0  # layers dropped by the hard cap before their time (should stay 0)

    def expire(self, now: float) -> None:
        span = self.window.span_s
        while self.layers and now - self.layers[0].last_add >= span:
            self.layers.popleft()

    def find(self, pid: int) -> _Layer | None:
        key = filter_key(pid)
        for layer in reversed(self.layers):
            if key in layer.bloom:
                return layer
        return None

    def add(self, pid: int, now: float) -> None:
        cur = self.layers[-1] if self.layers else None
        if cur is None or cur.count >= cur.capacity or now - cur.start >= self.window.size_s:
            if len(self.layers) >= self.window.max_layers:
                self.layers.popleft()
                self.dropped_early += 1
            cur = _Layer(self.layer_items, self.window.layer_false_positive_rate, now)
            self.layers.append(cur)
        cur.bloom.add(filter_key(pid))
        cur.count += 1
        cur.last_add = now

    @property
    def nbytes(self) -> int:
        return sum(layer.nbytes for layer in self.layers)

    @property
    def items(self) -> int:
        return sum(layer.count for layer in self.layers)

    def false_positive_rate(self) -> float:
        """The chance that a never-seen PID looks seen, from the layers as they are (not from the target).

        rbloom sets k = floor(log2(1 / p)) bits per key for a layer sized for false-positive rate p, so a key
        passes a layer whose fill ratio is f with chance f ** k; its ``approx_items`` is m / k * -ln(1 - f),
        which gives f back.  A lookup probes every layer.  Costs a pass over the bit arrays."""
        k = max(1, int(-math.log2(self.window.layer_false_positive_rate)))
        miss = 1.0
        for layer in self.layers:
            m = layer.bloom.size_in_bits
            fill = 1.0 - math.exp(-layer.bloom.approx_items * k / m)
            miss *= 1.0 - fill ** k
        return 1.0 - miss


class _PrincipalState:
    __slots__ = ("rate", "source", "capacity", "tokens", "stamp", "filter", "samples", "admitted", "seen",
                 "refreshed", "throttled", "last_throttle_ms", "throttle_ms_total")

    def __init__(self, rate: float, source: str, window: QuotaWindow, now: float):
        self.filter = LayeredBloomFilter(window, window.layer_items(rate))
        self.samples: collections.deque[list] = collections.deque()  # [start, admitted count]
        self.admitted = self.seen = self.refreshed = self.throttled = 0
        self.last_throttle_ms = self.throttle_ms_total = 0
        self.rate = rate
        self.capacity = window.burst(rate)
        self.tokens = self.capacity
        self.stamp = now
        self.source = source

    def set_rate(self, rate: float, source: str, window: QuotaWindow) -> None:
        self.source = source
        if rate != self.rate:
            self.rate = rate
            self.capacity = window.burst(rate)
            self.tokens = min(self.tokens, self.capacity)
            self.filter.layer_items = window.layer_items(rate)  # for layers made from now on

    def refill(self, now: float) -> None:
        if now > self.stamp:
            self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now

    def count_admission(self, now: float, window: QuotaWindow) -> None:
        if not self.samples or now - self.samples[-1][0] >= window.size_s:
            self.samples.append([now, 0])
            while len(self.samples) > window.num:
                self.samples.popleft()
        self.samples[-1][1] += 1

    def measured_rate(self, now: float, window: QuotaWindow) -> float:
        """New PIDs admitted per second over (up to) the last window_num windows."""
        while self.samples and now - self.samples[0][0] >= window.span_s:
            self.samples.popleft()
        if not self.samples:
            return 0.0
        return sum(c for _, c in self.samples) / max(now - self.samples[0][0], window.size_s)


_BATCH_LENGTH = struct.Struct(">i")
_PRODUCER_ID = struct.Struct(">q")
_HEADER_BYTES = 61  # RecordBatch v2 header; producerId at offset 43, magic at 16
MAX_BATCHES_SCANNED = 10_000


def batch_producer_ids(records: bytes | bytearray | memoryview) -> list[int]:
    """The distinct producer IDs (>= 0) of the v2 record batches in a Produce partition's records,
    read from the headers alone.  Stops quietly at anything malformed: the append reports it."""
    out: list[int] = []
    pos, end = 0, len(records)
    for _ in range(MAX_BATCHES_SCANNED):
        if end - pos < _HEADER_BYTES or records[pos + 16] != 2:
            break
        pid = _PRODUCER_ID.unpack_from(records, pos + 43)[0]
        if pid >= 0 and pid not in out:
            out.append(pid)
        length = _BATCH_LENGTH.unpack_from(records, pos + 8)[0]
        if length < _HEADER_BYTES - 12:
            break
        pos += 12 + length
    return out


def user_of(principal: str) -> str:
    return principal[len(USER_PREFIX):] if principal.startswith(USER_PREFIX) else principal


class ProducerIdQuotaManager:
    def __init__(self, window: QuotaWindow | None = None):
        self.window = window or QuotaWindow()
        self._lock = threading.Lock()
        self._user_rates: dict[str, float] = {}
        self._default_rate: float | None = None
        self._states: dict[str, _PrincipalState] = {}
        self.unlimited_checks = 0

    # -------------------------------------------------------------- configuration
    def configure(self, entries: Iterable[dict[str, Any]]) -> None:
        """Replace the quota configuration: [{"user": name | None (default), "values": {key: value}}]."""
        users: dict[str, float] = {}
        default = None
        for e in entries:
            rate = e.get("values", {}).get(PRODUCER_IDS_RATE)
            if rate is None:
                continue
            rate = float(rate)
            if not (math.isfinite(rate) and rate > 0):
                log.warning("ignoring producer_ids_rate %r for %s", rate, e.get("user") or "<default>")
                continue
            if e.get("user") is None:
                default = rate
            else:
                users[e["user"]] = rate
        with self._lock:
            self._user_rates, self._default_rate = users, default
            for principal in list(self._states):
                rate, source = self._quota_locked(principal)
                if rate is None:
                    del self._states[principal]  # quota lifted: forget its filter
                else:
                    self._states[principal].set_rate(rate, source, self.window)

    def _quota_locked(self, principal: str) -> tuple[float | None, str | None]:
        rate = self._user_rates.get(user_of(principal))
        if rate is not None:
            return rate, "user"
        if self._default_rate is not None:
            return self._default_rate, "default"
        return None, None

    # -------------------------------------------------------------- the check
    def check(self, principal: str, producer_id: int, now: float | None = None) -> int:
        """0 if ``principal`` may produce with ``producer_id`` now, else the throttle time in ms."""
        if producer_id < 0:
            return 0  # no producer state, nothing to limit
        if now is None:
            now = time.monotonic()
        with self._lock:
            st = self._states.get(principal)
            if st is None:
                rate, source = self._quota_locked(principal)
                if rate is None:
                    self.unlimited_checks += 1
                    return 0
                st = self._states[principal] = _PrincipalState(rate, source, self.window, now)
            filt = st.filter
            filt.expire(now)
            layer = filt.find(producer_id)
            if layer is not None:
                st.seen += 1
                if now - layer.start >= self.window.span_s / 2:
                    filt.add(producer_id, now)  # keep a producer that is still producing remembered
                    st.refreshed += 1
                return 0
            st.refill(now)
            if st.tokens >= 1.0:
                st.tokens -= 1.0
                filt.add(producer_id, now)
                st.admitted += 1
                st.count_admission(now, self.window)
                return 0
            wait_ms = max(1, math.ceil((1.0 - st.tokens) / st.rate * 1000))
            wait_ms = min(wait_ms, 2**31 - 1)
            st.throttled += 1
            st.last_throttle_ms = wait_ms
            st.throttle_ms_total += wait_ms
            return wait_ms

    def sweep(self, now: float | None = None) -> int:
        """Forget principals with nothing remembered and a full bucket (they carry no state). Returns how many."""
        if now is None:
            now = time.monotonic()
        with self._lock:
            idle = []
            for principal, st in self._states.items():
                st.filter.expire(now)
                st.refill(now)
                if not st.filter.layers and st.tokens >= st.capacity:
                    idle.append(principal)
            for principal in idle:
                del self._states[principal]
            return len(idle)

    # -------------------------------------------------------------- metrics
    def stats(self, now: float | None = None) -> dict[str, dict[str, Any]]:
        """Per tracked principal: rate (new PIDs/s measured), tokens, throttle_time_ms (the last throttle
        given), throttled_requests, and the quota, filter size and counters behind them."""
        if now is None:
            now = time.monotonic()
        out = {}
        with self._lock:
            for principal, st in sorted(self._states.items()):
                st.refill(now)
                filt = st.filter
                out[principal] = {
                    "quota": st.rate,
                    "quota_source": st.source,
                    "rate": round(st.measured_rate(now, self.window), 6),
                    "tokens": round(st.tokens, 3),
                    "burst": st.capacity,
                    "throttle_time_ms": st.last_throttle_ms,
                    "throttle_time_ms_total": st.throttle_ms_total,
                    "throttled_requests": st.throttled,
                    "new_pids": st.admitted,
                    "seen_pids": st.seen,
                    "refreshed_pids": st.refreshed,
                    "filter_layers": len(filt.layers),
                    "filter_items": filt.items,
                    "filter_bytes": filt.nbytes,
                    "layers_dropped_early": filt.dropped_early,
                }
        return out

    def config(self) -> dict[str, Any]:
        with self._lock:
            return {"default": self._default_rate, "users": dict(sorted(self._user_rates.items())),
                    "window_num": self.window.num, "window_size_s": self.window.size_s,
                    "false_positive_rate": self.window.false_positive_rate, "burst_s": self.window.burst_s}


__all__ = ["STATS_FILE", "LayeredBloomFilter", "ProducerIdQuotaManager", "QuotaConfigPoller", "QuotaWindow",
           "batch_producer_ids", "filter_key", "read_stats"]
