"""The broker side of KIP-730: hand producer IDs out of quorum-allocated blocks without ever blocking a request,
with a reserve of prefetched blocks sized from the demand, every block validated, and the broker's registration
kept alive by heartbeats.  Why and how: docs/brokers.md, "Producer-ID blocks, registration and heartbeats".

Threading: everything here runs on one asyncio event loop; ``generate_producer_id()`` must be called from that
loop's thread (it shares state with the refill task without locks, which is safe only there).
"""
from __future__ import annotations

import asyncio
import collections
import logging
import math
import random
import time
import uuid
from typing import Any, Awaitable, Callable, Protocol

from quorum.client.retry import RetryPolicy
from records.wire.errors import (
    BrokerIdNotRegisteredError,
    CoordinatorLoadInProgressError,
    PidQuorumError,
    RequestTimedOutError,
    StaleBrokerEpochError,
)

from .heartbeat import BrokerHeartbeat
from .pid_manager_config import (  # noqa: F401 - re-exported: importers name them from here
    DEFAULT_BROKER_HEARTBEAT_INTERVAL_MS,
    QUORUM_BROKER_SESSION_TIMEOUT_MS,
    PidManagerConfig,
)

log = logging.getLogger(__name__)

LONG_MAX = 2 ** 63 - 1
# How long close() waits for the heartbeat that removes the registration (then the broker stops anyway).
SHUTDOWN_HEARTBEAT_TIMEOUT_S = 5.0
_NEVER = LONG_MAX + 1  # an ID no block can reach: "do not wake the refill task from the fast path"


class PidQuorum(Protocol):
    """What the manager needs from the quorum (``quorum.client.quorum.QuorumClient`` has it)."""

    async def register_broker(self, broker_id: int, incarnation_id: uuid.UUID | None = None,
                              listener: str = "") -> int: ...

    async def allocate(self, broker_id: int, broker_epoch: int) -> Any:
        """An object with ``start``, ``length`` and (optionally) ``throttle_ms``."""

    async def heartbeat(self, broker_id: int, broker_epoch: int, want_fence: bool = False,
                        want_shut_down: bool = False) -> dict:
        """BrokerHeartbeat: ``{"is_fenced": ..., "should_shut_down": ...}`` (optional: without it, no heartbeats)."""


def is_authorization_error(err: BaseException) -> bool:
    """Any *_AUTHORIZATION_FAILED code: fatal for the broker (KIP-730)."""
    return isinstance(err, PidQuorumError) and err.code.name.endswith("AUTHORIZATION_FAILED")


class ProducerIdManager:
    """Hands producer IDs out of quorum-allocated blocks without ever blocking (docs/brokers.md).

    ``quorum`` is a ``QuorumClient`` or anything with the same async ``register_broker``
    and ``allocate`` (and ``heartbeat``: without it, no heartbeats); the manager does not
    close it.  ``heartbeat_interval_ms``: the broker's ``broker_heartbeat_interval_ms``
    (default ``DEFAULT_BROKER_HEARTBEAT_INTERVAL_MS``).
    ``clock`` (monotonic seconds) and ``sleep`` (an ``asyncio.sleep``-like coroutine used
    for backoff and throttle waits) can be injected by tests.
    """

    def __init__(self, broker_id: int, quorum: PidQuorum, *, listener: str = "",
                 config: PidManagerConfig | None = None, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
                 rng: random.Random | None = None, heartbeat_interval_ms: int | None = None):
        self.broker_id = broker_id
        self.quorum = quorum
        self.listener = listener
        self.config = config or PidManagerConfig()
        interval = DEFAULT_BROKER_HEARTBEAT_INTERVAL_MS if heartbeat_interval_ms is None else heartbeat_interval_ms
        if interval <= 0:
            raise ValueError(f"heartbeat_interval_ms must be positive, got {interval}")
        self.heartbeat_interval_s = interval / 1000.0
        self.incarnation_id = uuid.uuid4()  # one per manager instance: a retried registration keeps its epoch
        self._clock = clock
        self._sleep = sleep
        self._rng = rng or random.Random()
        self.broker_epoch: int | None = None

        # Current block [start, end) with the next ID to hand out; the hot path reads only these.
        self._cur_start = 0
        self._next = 0
        self._end = 0
        self._wake_at = _NEVER
        self._queue: collections.deque[tuple[int, int]] = collections.deque()  # (start, end) of queued blocks
        self._queued_ids = 0
        self._last_accepted_end: int | None = None  # exclusive end of the newest block ever accepted
        self._block_len = 1000  # length of the last accepted block (sizes the minimum reserve)
        self._consumed_before_current = 0  # IDs of blocks already left behind

        # Refill task.
        self._task: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None
        self._ready: asyncio.Event | None = None
        self._closed = False
        self._fatal: PidQuorumError | None = None
        c = self.config
        self._backoff = RetryPolicy(backoff_initial=c.backoff_initial_s, backoff_max=c.backoff_max_s,
                                    jitter=c.backoff_jitter).start(None, rng=self._rng)  # no deadline: retried forever
        self._cycle_start: float | None = None  # first attempt since the last accepted block
        self._cycle_failures = 0

        # Estimates.
        self._win_start_t: float | None = None
        self._win_start_count = 0
        self._rate_ewma = 0.0
        self._rate_last = 0.0
        self._rate_windows: collections.deque[float] = collections.deque(maxlen=self.config.rate_peak_windows)
        self._latency_ewma: float | None = None
        self._latency_max = 0.0
        self._waits: collections.deque[tuple[float, float]] = collections.deque(maxlen=256)  # (when, wait) >= 50 ms
        self._max_wait = 0.0
        self._max_outage = 0.0  # longest wait for a block that included failed attempts
        self._target = self._min_reserve()
        self._peak_reserve = 0

        # Counters.
        self._load_in_progress = 0
        self._prefetch_hits = 0    # the current block ran out and a prefetched one took over at once
        self._prefetch_misses = 0  # it ran out with none prefetched (one per dry spell; callers retry)
        self._dry = False
        self._fatal_refusals = 0
        self._blocks_fetched = 0
        self._blocks_rejected = 0
        self._fetch_errors: collections.Counter[str] = collections.Counter()
        self._register_errors: collections.Counter[str] = collections.Counter()
        self._registrations = 0
        self._re_registrations = 0
        self._outages = 0
        self._backoffs = 0
        self._throttle_waits = 0
        self._early_windows = 0

        # Heartbeat task (BrokerHeartbeat every heartbeat_interval_s for the current epoch).
        self._heartbeat = BrokerHeartbeat(self, self.heartbeat_interval_s)
        self._hb_task: asyncio.Task | None = None
        self._shut_down_sent = False
        self._register_after_backoff = False  # the refill task backs off before registering again
        self.backoff_delays: collections.deque[float] = collections.deque(maxlen=1000)  # for tests and stats

    # ------------------------------------------------------------------ hot path
    def generate_producer_id(self) -> int:
        """The next producer ID.  Synchronous, never blocks, O(1); call it from the loop's thread only.

        Raises ``CoordinatorLoadInProgressError`` at once when no block is in hand (the
        client retries), or the fatal error (e.g. ``ClusterAuthorizationFailedError``)
        once refilling has stopped for good and the blocks in hand are spent.
        """
        nxt = self._next
        if nxt < self._end:
            self._next = nxt + 1
            if nxt >= self._wake_at:
                self._wake_at = _NEVER
                self._wake.set()
            return nxt
        return self._next_block_or_raise()

    def _next_block_or_raise(self) -> int:
        if self._queue:
            self._prefetch_hits += 1
            start, end = self._queue.popleft()
            self._queued_ids -= end - start
            self._consumed_before_current += self._end - self._cur_start
            self._cur_start, self._next, self._end = start, start + 1, end
            self._wake_at = _NEVER
            if self._wake is not None:
                self._wake.set()  # a queue slot is free and the reserve shrank: let the task look
            return start
        if self._fatal is not None:
            self._fatal_refusals += 1
            raise type(self._fatal)(f"broker {self.broker_id}: producer IDs unavailable: {self._fatal.message}")
        self._load_in_progress += 1
        if not self._dry:
            self._dry = True
            self._prefetch_misses += 1
        if self._wake is not None:
            self._wake.set()
        raise CoordinatorLoadInProgressError(f"broker {self.broker_id}: no producer-ID block in hand yet")

    # --------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        """Register, fetch the first block and start refilling; returns once the first block is in hand.

        Raises the fatal error if the quorum refuses authorization, or
        ``RequestTimedOutError`` after ``config.start_timeout_s``; in both cases the
        manager is closed.
        """
        if self._task is not None or self._closed:
            raise RuntimeError("ProducerIdManager.start() called twice or after close()")
        loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._ready = asyncio.Event()
        self._heartbeat.arm()
        if self.heartbeats_enabled:
            self._hb_task = loop.create_task(self._heartbeat.run(), name=f"broker-heartbeat-{self.broker_id}")
        self._task = loop.create_task(self._run(), name=f"pid-refill-{self.broker_id}")
        ready = loop.create_task(self._ready.wait())
        try:
            await asyncio.wait({ready, self._task}, timeout=self.config.start_timeout_s,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
        if self._fatal is not None:
            await self.close()
            raise self._fatal
        if self._task.done() and not self._ready.is_set():
            exc = None if self._task.cancelled() else self._task.exception()
            await self.close()
            raise exc or RuntimeError("producer-ID refill task ended before the first block")
        if not self._ready.is_set():
            errors = dict(self._fetch_errors + self._register_errors)
            await self.close()
            raise RequestTimedOutError(f"broker {self.broker_id}: no producer-ID block within "
                                       f"{self.config.start_timeout_s:g}s (errors: {errors or 'none'}, "
                                       f"blocks rejected: {self._blocks_rejected})")

    async def close(self, shut_down: bool = True) -> None:
        """Stop the refill and heartbeat tasks (cancels a request in flight).  IDs in hand can still be generated.

        ``shut_down`` (a clean stop of the broker): if heartbeats are on and the broker is registered,
        send one heartbeat asking to shut down (Kafka's controlled shutdown), waiting at most
        ``SHUTDOWN_HEARTBEAT_TIMEOUT_S``: the quorum removes the registration, so the next incarnation
        of this broker id registers at once.  If it fails, the session lapses on its own."""
        first = not self._closed
        self._closed = True
        for attr in ("_task", "_hb_task"):
            task = getattr(self, attr)
            setattr(self, attr, None)
            if task is not None and not task.done():
                task.cancel()
            if task is not None:
                try:
                    await task
                except asyncio.CancelledError:
                    pass
                except Exception:  # noqa: BLE001 - already logged by the task
                    pass
        if first and shut_down and self.heartbeats_enabled and self.broker_epoch is not None:
            await self._send_shut_down()

    async def _send_shut_down(self) -> None:
        epoch = self.broker_epoch
        try:
            await asyncio.wait_for(self.quorum.heartbeat(self.broker_id, epoch, want_shut_down=True),
                                   SHUTDOWN_HEARTBEAT_TIMEOUT_S)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - the stop goes on; the session lapses by itself
            log.warning("broker %d: the shut-down heartbeat (epoch %s) failed: %s: %s; the registration holds "
                        "the broker id until its session lapses", self.broker_id, epoch, type(e).__name__, e)
            return
        self._shut_down_sent = True
        if self.broker_epoch == epoch:
            self.broker_epoch = None
        log.info("broker %d: registration (epoch %s) removed by a shut-down heartbeat", self.broker_id, epoch)

    @property
    def heartbeats_enabled(self) -> bool:
        """The quorum object can heartbeat (a ``QuorumClient`` can; test doubles may not)."""
        return callable(getattr(self.quorum, "heartbeat", None))

    @property
    def closed(self) -> bool:
        return self._closed

    def heartbeat_refused_epoch(self) -> None:
        """The heartbeat task found the epoch stale: the refill task backs off and registers again."""
        self._re_registrations += 1
        self.broker_epoch = None
        self._register_after_backoff = True
        if self._wake is not None:
            self._wake.set()

    @property
    def fatal_error(self) -> PidQuorumError | None:
        """The error that stopped refilling for good (an authorization failure), if any."""
        return self._fatal

    # ------------------------------------------------------------- refill task
    async def _run(self) -> None:
        try:
            while not self._closed and self._fatal is None:
                now = self._clock()
                self._sample_rate(now)
                if self.broker_epoch is None:
                    if self._register_after_backoff:  # a heartbeat found the epoch stale: as _fetch_one does
                        self._register_after_backoff = False
                        await self._back_off()
                        continue
                    await self._register()
                    continue
                if self._needs_block():
                    await self._fetch_one()
                    continue
                self._arm_wake()
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), self.config.rate_window_s)
                except asyncio.TimeoutError:
                    pass
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("broker %d: producer-ID refill task failed", self.broker_id)
            raise

    def _needs_block(self) -> bool:
        if len(self._queue) >= self.config.max_prefetch_blocks:
            return False
        return self.reserve_ids <= self._target or (self._next >= self._end and not self._queue)

    def _arm_wake(self) -> None:
        """Set the ID at which the hot path wakes the task: the reserve falls to the target."""
        if len(self._queue) >= self.config.max_prefetch_blocks:
            self._wake_at = _NEVER  # nothing to do until a queued block moves up (slow path wakes)
        else:
            # reserve after handing out id x = (end - x - 1) + queued; at or below target when
            # x >= end + queued - target - 1
            self._wake_at = max(self._next, self._end + self._queued_ids - self._target - 1)

    async def reregister(self) -> None:
        """Register again now (a caller saw STALE_BROKER_EPOCH, e.g. on the transactional path).

        Keeps the incarnation id: if the quorum still holds this registration the epoch is
        unchanged; failures are handled (and backed off) as in the refill task."""
        await self._register()

    async def _register(self) -> None:
        try:
            self.broker_epoch = await self.quorum.register_broker(self.broker_id, self.incarnation_id,
                                                                  self.listener)
            self._registrations += 1
            self._heartbeat.registered()  # the session starts now: heartbeat at once
            log.info("broker %d registered (incarnation %s): epoch %d", self.broker_id, self.incarnation_id,
                     self.broker_epoch)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - everything but authorization is retried
            await self._failed(e, "BrokerRegistration", "registration", self._register_errors)

    async def _fetch_one(self) -> None:
        if self._cycle_start is None:
            self._cycle_start = self._clock()
        t0 = self._clock()
        try:
            block = await self.quorum.allocate(self.broker_id, self.broker_epoch)
        except asyncio.CancelledError:
            raise
        except (StaleBrokerEpochError, BrokerIdNotRegisteredError) as e:
            self._note_failure()
            self._fetch_errors[type(e).__name__] += 1
            self._re_registrations += 1
            log.warning("broker %d: epoch %s refused (%s); registering again", self.broker_id, self.broker_epoch,
                        e.code.name)
            self.broker_epoch = None
            self._register_after_backoff = False  # backed off here
            await self._back_off()  # not reset: a fresh epoch is not a block (KAFKA-20058)
            return
        except Exception as e:  # noqa: BLE001
            await self._failed(e, "AllocateProducerIds", "AllocateProducerIds", self._fetch_errors)
            return
        now = self._clock()
        start, length = block.start, block.length
        problem = self._validate(start, length)
        if problem is not None:
            self._note_failure()
            self._blocks_rejected += 1
            log.error("broker %d: refused block start=%d length=%d from %s: %s (newest accepted end=%s)",
                      self.broker_id, start, length, getattr(block, "node", "?"), problem,
                      self._last_accepted_end)
            await self._back_off()  # not reset by a refused block (KAFKA-20114)
            return
        self._accept(start, length, now - t0, now)
        throttle_ms = getattr(block, "throttle_ms", 0) or 0
        if throttle_ms > 0:
            self._throttle_waits += 1
            await self._sleep(throttle_ms / 1000.0)

    def _validate(self, start: int, length: int) -> str | None:
        if not isinstance(start, int) or not isinstance(length, int):
            return "start and length must be integers"
        if start < 0:
            return "start is negative"
        if length <= 0:
            return "length is not positive"
        if start > LONG_MAX - length:
            return f"block would pass the last producer ID (start > {LONG_MAX} - length)"
        if self._last_accepted_end is not None and start <= self._last_accepted_end - 1:
            return f"start is at or below the last ID already held ({self._last_accepted_end - 1})"
        return None

    def _accept(self, start: int, length: int, latency: float, now: float) -> None:
        end = start + length
        if self._next >= self._end and not self._queue:
            # Nothing in hand: the block becomes current straight away.  If a block had just run out and
            # nobody was refused meanwhile, the prefetch was in time: a hit (a refusal counted the miss).
            if not self._dry and self._end > self._cur_start:
                self._prefetch_hits += 1
            self._consumed_before_current += self._end - self._cur_start
            self._cur_start, self._next, self._end = start, start, end
        else:
            self._queue.append((start, end))
            self._queued_ids += length
        self._last_accepted_end = end
        self._dry = False
        self._block_len = length
        self._blocks_fetched += 1
        self._backoff.reset()  # the only place the backoff is reset
        a = self.config.latency_ewma_alpha
        self._latency_ewma = latency if self._latency_ewma is None else (1 - a) * self._latency_ewma + a * latency
        self._latency_max = max(self._latency_max, latency)
        wait = now - (self._cycle_start if self._cycle_start is not None else now - latency)
        if self._cycle_failures or wait >= 0.05:
            self._waits.append((now, wait))
        self._max_wait = max(self._max_wait, wait)
        if self._cycle_failures:
            self._outages += 1
            self._max_outage = max(self._max_outage, wait)
        self._cycle_start, self._cycle_failures = None, 0
        self._update_target(now)
        self._peak_reserve = max(self._peak_reserve, self.reserve_ids)
        if self._ready is not None:
            self._ready.set()

    async def _failed(self, err: Exception, rpc: str, what: str, errors: collections.Counter[str]) -> None:
        """A request to the quorum failed: fatal if not authorized, else counted in ``errors``, logged, backed off."""
        self._note_failure()
        if self._check_fatal(err, rpc):
            return
        errors[type(err).__name__] += 1
        log.warning("broker %d: %s failed: %s: %s", self.broker_id, what, type(err).__name__, err)
        await self._back_off()

    def _note_failure(self) -> None:
        if self._cycle_start is None:
            self._cycle_start = self._clock()
        self._cycle_failures += 1

    def _check_fatal(self, err: Exception, what: str) -> bool:
        if not is_authorization_error(err):
            return False
        self._fatal = err
        self._fetch_errors[type(err).__name__] += 1
        log.error("broker %d: %s refused: %s: not authorized (KIP-730: fatal); no more producer-ID blocks "
                  "(%d IDs left in hand)", self.broker_id, what, err.code.name, self.reserve_ids)
        if self._ready is not None:
            self._ready.set()
        return True

    async def _back_off(self) -> None:
        delay = self._backoff.next_delay()  # never None: no deadline, no cap on tries
        self._backoffs += 1
        self.backoff_delays.append(delay)
        await self._sleep(delay)

    # --------------------------------------------------------------- estimates
    def _sample_rate(self, now: float) -> None:
        consumed = self.generated
        if self._win_start_t is None:
            self._win_start_t, self._win_start_count = now, consumed
            return
        dt = now - self._win_start_t
        if dt <= 0:
            return
        ids = consumed - self._win_start_count
        rate = ids / dt
        if dt < self.config.rate_window_s:
            # A surge closes the window early (after a tenth of it), so that a jump in demand
            # raises the reserve within milliseconds instead of after a whole window.
            if not (dt >= self.config.rate_window_s / 10 and ids >= self._min_reserve()
                    and rate > 2 * self.rate_estimate):
                return
            self._early_windows += 1
        a = self.config.rate_ewma_alpha
        self._rate_ewma = rate if not self._rate_windows else (1 - a) * self._rate_ewma + a * rate
        self._rate_last = rate
        self._rate_windows.append(rate)
        self._win_start_t, self._win_start_count = now, consumed
        self._update_target(now)

    @property
    def rate_estimate(self) -> float:
        """IDs/s the reserve is sized for: max(EWMA, peak of the recent windows)."""
        return max(self._rate_ewma, max(self._rate_windows, default=0.0))

    def failover_budget(self, now: float | None = None) -> float:
        """The configured budget, raised to ``outage_margin`` x the longest recent wait for a block."""
        c = self.config
        budget = c.failover_budget_s
        if c.learn_failover_budget and self._waits:
            now = self._clock() if now is None else now
            recent = [w for t, w in self._waits if now - t <= c.outage_memory_s]
            if recent:
                budget = max(budget, c.outage_margin * max(recent))
        return budget

    def _min_reserve(self) -> int:
        return max(1, math.ceil((1.0 - self.config.prefetch_threshold) * self._block_len))

    def _update_target(self, now: float) -> None:
        c = self.config
        target = self._min_reserve()
        if c.adaptive:
            horizon = self.failover_budget(now) + (self._latency_ewma or 0.0)
            target = max(target, math.ceil(self.rate_estimate * horizon))
        self._target = min(target, c.max_prefetch_blocks * self._block_len)

    # ------------------------------------------------------------------- views
    @property
    def generated(self) -> int:
        """IDs handed out so far."""
        return self._consumed_before_current + (self._next - self._cur_start)

    @property
    def reserve_ids(self) -> int:
        """IDs in hand: the rest of the current block plus the queued blocks."""
        return max(0, self._end - self._next) + self._queued_ids

    @property
    def target_reserve(self) -> int:
        return self._target

    def stats(self) -> dict:
        now = self._clock()
        has_current = self._end > self._cur_start
        return {
            "broker_id": self.broker_id,
            "broker_epoch": self.broker_epoch,
            "incarnation_id": str(self.incarnation_id),
            "current_block": ({"start": self._cur_start, "end": self._end, "last_id": self._end - 1,
                               "next": self._next, "remaining": max(0, self._end - self._next)}
                              if has_current else None),
            "queued_blocks": [[s, e - s] for s, e in self._queue],
            "queued_block_count": len(self._queue),
            "reserve_ids": self.reserve_ids,
            "peak_reserve_ids": self._peak_reserve,
            "target_reserve_ids": self._target,
            "rate_estimate_per_s": self.rate_estimate,
            "rate_ewma_per_s": self._rate_ewma,
            "rate_peak_per_s": max(self._rate_windows, default=0.0),
            "rate_last_window_per_s": self._rate_last,
            "failover_budget_s": self.failover_budget(now),
            "allocate_latency_ewma_s": self._latency_ewma,
            "allocate_latency_max_s": self._latency_max,
            "max_block_wait_s": self._max_wait,
            "max_outage_s": self._max_outage,
            "backoff_attempts": self._backoff.attempts,
            "last_backoff_s": self._backoff.last_delay,
            "fatal_error": None if self._fatal is None else f"{self._fatal.code.name}: {self._fatal.message}",
            "closed": self._closed,
            "counters": {
                "generated": self.generated,
                "load_in_progress": self._load_in_progress,
                "prefetch_hits": self._prefetch_hits,
                "prefetch_misses": self._prefetch_misses,
                "fatal_refusals": self._fatal_refusals,
                "blocks_fetched": self._blocks_fetched,
                "blocks_rejected": self._blocks_rejected,
                "fetch_errors": dict(self._fetch_errors),
                "register_errors": dict(self._register_errors),
                "registrations": self._registrations,
                "re_registrations": self._re_registrations,
                "outages": self._outages,
                "backoffs": self._backoffs,
                "throttle_waits": self._throttle_waits,
                "surge_windows": self._early_windows,
                "heartbeats": self._heartbeat.answered,
                "heartbeat_errors": dict(self._heartbeat.errors),
                "heartbeat_re_registrations": self._heartbeat.re_registrations,
            },
            "heartbeat_interval_s": self.heartbeat_interval_s if self.heartbeats_enabled else None,
            "last_heartbeat_age_s": (None if self._heartbeat.last_ok is None
                                     else time.monotonic() - self._heartbeat.last_ok),
            "shut_down_heartbeat_sent": self._shut_down_sent,
        }


__all__ = ["DEFAULT_BROKER_HEARTBEAT_INTERVAL_MS", "LONG_MAX", "PidManagerConfig", "PidQuorum", "ProducerIdManager",
           "QUORUM_BROKER_SESSION_TIMEOUT_MS", "is_authorization_error"]
