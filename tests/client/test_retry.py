"""quorum.client.retry: the one retry policy (delays, cap, jitter, deadline, tries, determinism) and the
QuorumClient's use of it."""
from __future__ import annotations

import asyncio
import random
import socket

import pytest

from quorum.client.quorum import QuorumClient
from quorum.client.quorum import RetryPolicy as ReExported
from quorum.client.retry import FORWARD_POLICY, Backoff, RetryPolicy, result_within
from records.wire.errors import RequestTimedOutError


class FakeClock:
    def __init__(self, t: float = 100.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def no_jitter(**kw) -> RetryPolicy:
    return RetryPolicy(jitter=0.0, **kw)


def test_client_quorum_re_exports_the_policy():
    assert ReExported is RetryPolicy


def test_delays_grow_by_the_factor_from_the_initial_delay_up_to_the_cap():
    p = no_jitter(backoff_initial=0.05, backoff_max=1.0)
    assert [p.delay(n) for n in range(7)] == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    p3 = no_jitter(backoff_initial=0.01, backoff_max=10.0, backoff_factor=3.0)
    assert [p3.delay(n) for n in range(4)] == pytest.approx([0.01, 0.03, 0.09, 0.27])
    assert p.delay(10_000) == 1.0  # no overflow however long it has been failing


def test_jitter_stays_in_its_symmetric_band_and_never_passes_the_cap():
    p = RetryPolicy(backoff_initial=0.1, backoff_max=0.4, jitter=0.2, rng=random.Random(1))
    for n in range(6):
        base = min(0.4, 0.1 * 2 ** n)
        for _ in range(200):
            d = p.delay(n)
            assert base * 0.8 <= d <= min(0.4, base * 1.2)
    below = [p.delay(0) for _ in range(500)]
    assert min(below) < 0.1 < max(below)  # both sides of the base are drawn


class Edges(random.Random):
    def __init__(self, values):
        super().__init__()
        self.values = list(values)

    def random(self):
        return self.values.pop(0)


def test_the_jitter_rule_at_its_edges():
    p = RetryPolicy(backoff_initial=1.0, backoff_max=10.0, jitter=0.25, rng=Edges([0.0, 0.5, 0.999999]))
    assert p.delay(0) == pytest.approx(0.75)
    assert p.delay(0) == pytest.approx(1.0)
    assert p.delay(0) == pytest.approx(1.25, rel=1e-5)
    capped = RetryPolicy(backoff_initial=1.0, backoff_max=1.0, jitter=0.5, rng=Edges([0.99]))
    assert capped.delay(3) == 1.0


def test_a_seeded_rng_gives_the_same_delays():
    def delays(seed):
        b = RetryPolicy(backoff_initial=0.01, backoff_max=1.0, rng=random.Random(seed)).start(None)
        return [b.next_delay() for _ in range(10)]
    assert delays(42) == delays(42)
    assert delays(42) != delays(43)
    # the rng given to one call wins over the policy's
    p = RetryPolicy(rng=random.Random(1))
    assert [p.start(rng=random.Random(5)).next_delay() for _ in range(3)] == \
        [RetryPolicy(rng=random.Random(5)).start().next_delay()] * 3


def test_a_backoff_counts_its_attempts_and_reset_starts_the_delays_over():
    b = no_jitter(backoff_initial=0.05, backoff_max=5.0).start(None)
    assert [b.next_delay() for _ in range(4)] == pytest.approx([0.05, 0.1, 0.2, 0.4])
    assert b.attempts == 4 and b.last_delay == pytest.approx(0.4)
    b.reset()
    assert b.attempts == 0 and b.last_delay == pytest.approx(0.4)  # the last delay is history, kept
    assert b.next_delay() == pytest.approx(0.05)


def test_the_deadline_cuts_the_last_delay_and_ends_the_retries():
    clock = FakeClock()
    b = no_jitter(backoff_initial=0.3, backoff_max=0.3).start(1.0, clock=clock)
    assert b.remaining() == pytest.approx(1.0) and not b.expired
    assert b.next_delay() == pytest.approx(0.3)
    clock.t += 0.8
    assert b.next_delay() == pytest.approx(0.2)  # only what is left
    clock.t += 0.2
    assert b.expired and b.exhausted and b.remaining() == 0.0
    assert b.next_delay() is None and b.attempts == 2


def test_the_policy_timeout_is_the_default_deadline_and_none_means_none():
    clock = FakeClock()
    p = no_jitter(timeout=2.5)
    assert p.start(clock=clock).deadline == pytest.approx(102.5)
    assert p.start(0.5, clock=clock).deadline == pytest.approx(100.5)
    forever = p.start(None, clock=clock)
    clock.t += 1e9
    assert forever.deadline is None and forever.remaining() == float("inf") and forever.next_delay() == 0.01


def test_max_tries_caps_the_delays_of_one_call():
    b = no_jitter(max_tries=2).start(None)
    assert b.next_delay() is not None and b.next_delay() is not None
    assert b.exhausted and b.next_delay() is None
    b.reset()
    assert b.next_delay() is not None


def test_sleep_waits_the_next_delay_and_says_when_to_give_up():
    clock = FakeClock()
    slept = []

    async def sleep(d):
        slept.append(d)
        clock.t += d

    async def go():
        b = no_jitter(backoff_initial=0.4, backoff_max=0.4).start(1.0, clock=clock)
        results = [await b.sleep(sleep) for _ in range(4)]
        return results
    assert asyncio.run(go()) == [True, True, True, False]
    assert slept == pytest.approx([0.4, 0.4, 0.2])


def test_a_forwarding_loop_tries_every_20_ms_until_its_deadline():
    """The pattern of a follower forwarding to the leader: a fixed 20 ms between tries, the last
    delay cut to the deadline, then the request times out."""
    clock = FakeClock()
    tries = []

    async def sleep(d):
        clock.t += d

    async def route(timeout):
        backoff = FORWARD_POLICY.start(timeout, clock=clock)
        while True:
            if backoff.expired:
                raise RequestTimedOutError("no leader")
            tries.append(backoff.remaining())
            await backoff.sleep(sleep)

    with pytest.raises(RequestTimedOutError):
        asyncio.run(route(0.05))
    assert tries == pytest.approx([0.05, 0.03, 0.01])


def test_a_policy_is_checked_and_copied():
    with pytest.raises(ValueError):
        RetryPolicy(jitter=1.0)
    with pytest.raises(ValueError):
        RetryPolicy(backoff_initial=1.0, backoff_max=0.5)
    with pytest.raises(ValueError):
        RetryPolicy(backoff_factor=0.5)
    p = RetryPolicy(timeout=3.0)
    q = p.copy(timeout=7.0)
    assert (p.timeout, q.timeout, q.attempt_timeout) == (3.0, 7.0, p.attempt_timeout)
    assert isinstance(p.start(), Backoff)
    assert p.backoff(0) <= p.backoff_initial * (1 + p.jitter)


def test_the_client_gives_up_at_the_deadline_when_no_node_answers():
    """Two closed ports: the client goes round them with backoff and raises at its deadline."""
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])

    async def go():
        c = QuorumClient([f"127.0.0.1:{p}" for p in ports], RetryPolicy(timeout=0.3, attempt_timeout=0.1))
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        try:
            with pytest.raises(RequestTimedOutError, match="no node answered within 0.3s"):
                await c.register_broker(1)
        finally:
            await c.close()
        return loop.time() - t0
    assert 0.25 <= asyncio.run(go()) < 3.0


def test_the_client_stops_after_max_tries_rounds():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def go():
        c = QuorumClient([f"127.0.0.1:{port}"], RetryPolicy(timeout=30.0, attempt_timeout=0.1, max_tries=2))
        try:
            with pytest.raises(RequestTimedOutError, match="in 3 rounds"):
                await c.register_broker(1)
        finally:
            await c.close()
    asyncio.run(go())


# ------------------------------------------------------------- result_within
def test_result_within_gives_the_result_and_resumes_in_the_iteration_after_it_is_set():
    async def main():
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        order = []
        loop.call_soon(lambda: (fut.set_result(7), order.append("set")))
        # A callback queued right after the result: a waiter that resumes one pass later than
        # ``await fut`` (asyncio.wait_for's) runs after it, this one before it.
        loop.call_soon(lambda: loop.call_soon(order.append, "next pass"))
        value = await result_within(fut, 5.0)
        order.append("resumed")
        await asyncio.sleep(0)
        return value, order

    value, order = asyncio.run(main())
    assert value == 7
    assert order == ["set", "resumed", "next pass"]


def test_result_within_times_out_and_cancels_the_future():
    async def main():
        fut = asyncio.get_running_loop().create_future()
        with pytest.raises(asyncio.TimeoutError):
            await result_within(fut, 0.01)
        return fut

    assert asyncio.run(main()).cancelled()


def test_result_within_passes_on_the_futures_error_and_a_cancelled_caller_cancels_it():
    async def main():
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        loop.call_soon(fut.set_exception, RequestTimedOutError("boom"))
        with pytest.raises(RequestTimedOutError):
            await result_within(fut, 5.0)
        fut2 = loop.create_future()
        task = loop.create_task(result_within(fut2, 5.0))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):  # a cancel, not a timeout
            await task
        return fut2

    assert asyncio.run(main()).cancelled()
