"""Retry and backoff: the one policy every retry loop uses.

``RetryPolicy`` says how a call is retried (deadline, bound on one attempt, growing jittered delays,
optionally a cap on their number, as kazoo's ``KazooRetry``); it holds no state and may be shared.  Each
call takes its own ``Backoff`` from ``policy.start()``; when to ``reset()`` it is the caller's decision
(``QuorumClient`` uses one per call, the broker's producer-ID manager one for its lifetime, reset when a
block is accepted).
"""
from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import dataclass, field, replace
from typing import Any, Awaitable, Callable

_POLICY_TIMEOUT: Any = object()  # start(): "the policy's own timeout"


@dataclass
class RetryPolicy:
    """How a call is retried.  Times in seconds."""

    timeout: float = 10.0
    """Overall deadline of one call."""
    attempt_timeout: float = 3.0
    """Bound on one request to one node."""
    backoff_initial: float = 0.01
    """The first delay."""
    backoff_max: float = 0.25
    """No delay is longer."""
    jitter: float = 0.2
    """Each delay is multiplied by a random factor in [1 - jitter, 1 + jitter] (then capped at backoff_max)."""
    backoff_factor: float = 2.0
    max_tries: int | None = None
    """At most this many delays (retries) per call; None: until the deadline."""
    rng: random.Random | None = field(default=None, repr=False, compare=False)
    """Random source of the jitter; None: the ``random`` module's."""

    def __post_init__(self) -> None:
        problems = []  # the timeouts are the caller's (pidctl --timeout): a zero one fails the call, not here
        if not 0 <= self.backoff_initial <= self.backoff_max:
            problems.append("need 0 <= backoff_initial <= backoff_max")
        if not 0.0 <= self.jitter < 1.0:
            problems.append("jitter must be in [0, 1)")
        if self.backoff_factor < 1.0:
            problems.append("backoff_factor must be >= 1")
        if self.max_tries is not None and self.max_tries < 0:
            problems.append("max_tries must be >= 0 (or None)")
        if problems:
            raise ValueError("; ".join(problems))

    def copy(self, **changes: Any) -> "RetryPolicy":
        """This policy with ``changes`` (e.g. another timeout)."""
        return replace(self, **changes)

    def base_delay(self, attempt: int) -> float:
        """The delay before jitter after ``attempt`` earlier delays."""
        try:
            grown = self.backoff_initial * self.backoff_factor ** attempt
        except OverflowError:
            grown = math.inf
        return min(self.backoff_max, grown)

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """The delay after ``attempt`` earlier delays, with jitter, the one rule everywhere: ``base_delay``
        times a factor drawn uniformly from ``[1 - jitter, 1 + jitter]``, never more than ``backoff_max``.
        The random source is ``rng``, else the policy's, so a test with a seeded ``random.Random`` sees
        fixed delays."""
        r = (rng or self.rng or random).random()
        return min(self.backoff_max, self.base_delay(attempt) * (1 + self.jitter * (2 * r - 1)))

    def backoff(self, attempt: int) -> float:
        """Same as ``delay(attempt)`` (the older name)."""
        return self.delay(attempt)

    def start(self, timeout: float | None = _POLICY_TIMEOUT, *, clock: Callable[[], float] = time.monotonic,
              rng: random.Random | None = None) -> "Backoff":
        """The state of one call: its deadline ``timeout`` seconds from now (default: the policy's
        ``timeout``; None: no deadline) and an attempt counter at 0."""
        return Backoff(self, self.timeout if timeout is _POLICY_TIMEOUT else timeout, clock=clock, rng=rng)


class Backoff:
    """One call's retry state: how many delays were handed out, and the deadline.  A loop that retries
    until a deadline, e.g. forwarding to the leader::

        backoff = FORWARD_POLICY.start(timeout)
        while True:
            if backoff.expired:
                raise RequestTimedOutError(...)
            ... try once, bounded by backoff.remaining() ...
            await backoff.sleep()
    """

    def __init__(self, policy: RetryPolicy, timeout: float | None = None, *,
                 clock: Callable[[], float] = time.monotonic, rng: random.Random | None = None):
        self.policy = policy
        self._clock = clock
        self._rng = rng or policy.rng
        self.deadline: float | None = None if timeout is None else clock() + timeout
        self.attempts = 0
        """Delays handed out since the start or the last ``reset()``."""
        self.last_delay = 0.0

    def remaining(self) -> float:
        """Seconds left before the deadline (never negative; infinite without one)."""
        if self.deadline is None:
            return math.inf
        return max(0.0, self.deadline - self._clock())

    @property
    def expired(self) -> bool:
        return self.deadline is not None and self._clock() >= self.deadline

    @property
    def exhausted(self) -> bool:
        """No retry is left: the deadline passed or ``max_tries`` delays were handed out."""
        tries = self.policy.max_tries
        return self.expired or (tries is not None and self.attempts >= tries)

    def next_delay(self) -> float | None:
        """The delay before the next try, cut to the deadline; None when the call should give up."""
        if self.exhausted:
            return None
        delay = min(self.policy.delay(self.attempts, self._rng), self.remaining())
        self.attempts += 1
        self.last_delay = delay
        return delay

    async def sleep(self, sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> bool:
        """Wait for ``next_delay()`` with ``sleep``; False (at once) when the call should give up."""
        delay = self.next_delay()
        if delay is None:
            return False
        await sleep(delay)
        return True

    def reset(self) -> None:
        """Back to the first delay (the deadline stays)."""
        self.attempts = 0

    def __repr__(self) -> str:
        return f"<Backoff attempts={self.attempts} remaining={self.remaining():.3f}s>"


async def result_within(fut: asyncio.Future, timeout: float) -> Any:
    """``await fut``; past ``timeout`` seconds ``fut`` is cancelled and asyncio.TimeoutError raised.

    What ``asyncio.wait_for(fut, timeout)`` does for a future, minus its hops: wait_for waits on a
    second future that a callback of ``fut`` settles, so the caller resumes one loop iteration after
    ``fut`` is settled (two behind ``asyncio.shield``).  On a request's path every iteration is a pass
    through the event loop (its selector call, its ready queue); this resumes in the iteration after
    ``fut`` is settled, as a plain ``await fut`` does.  Cancelling the caller cancels ``fut``, as
    wait_for does.
    """
    expired = False

    def expire() -> None:
        nonlocal expired
        if not fut.done():
            expired = True
            fut.cancel()

    handle = asyncio.get_running_loop().call_later(timeout, expire)
    try:
        return await fut
    except asyncio.CancelledError:
        if expired:
            raise asyncio.TimeoutError from None
        raise
    finally:
        handle.cancel()


FORWARD_POLICY = RetryPolicy(backoff_initial=0.02, backoff_max=0.02, jitter=0.0)
"""A follower forwarding to the leader: a try every 20 ms until the request's deadline
(``start(timeout)`` with the node's request timeout)."""

LEADER_POLL = RetryPolicy(backoff_initial=0.02, backoff_max=0.1, jitter=0.2)
"""Waiting for a leader (``QuorumClient.find_leader``): DescribeState rounds 20 ms apart, then up to 100 ms."""

__all__ = ["Backoff", "FORWARD_POLICY", "LEADER_POLL", "RetryPolicy", "result_within"]
