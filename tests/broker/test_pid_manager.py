"""broker.pid_manager.ProducerIdManager: unit tests against a fake quorum, and one
integration test against a real three-node cluster.

The fake quorum hands out consecutive blocks and can be scripted per call
(a block to return, an exception to raise, or "hang" = never answer).
Waits are on conditions with deadlines; the only sleeps are the pacing of a
demand loop and zero-length yields to the event loop.
"""
from __future__ import annotations

import asyncio
import bisect
import collections
import logging
import random
import time

import pytest

from broker.pid_manager import LONG_MAX, PidManagerConfig, ProducerIdManager
from quorum.client.quorum import AllocatedBlock
from quorum.trail import iter_blocks
from tests.support.loop import until
from records.wire.errors import (
    BrokerIdNotRegisteredError,
    ClusterAuthorizationFailedError,
    CoordinatorLoadInProgressError,
    Errors,
    NotControllerError,
    PidQuorumError,
    RequestTimedOutError,
    StaleBrokerEpochError,
    TransactionalIdAuthorizationFailedError,
    UnknownServerError,
    for_code,
)

HANG = "hang"
TopicAuthorizationFailedError = type(for_code(Errors.TOPIC_AUTHORIZATION_FAILED))


class FakeQuorum:
    """Consecutive blocks of ``block_size`` from ``first``; ``script`` overrides calls one by one."""

    def __init__(self, block_size: int = 10, first: int = 0, clock=None, allocate_delay_s: float = 0.0):
        self.block_size = block_size
        self.next = first
        self.script: collections.deque = collections.deque()
        self.hang_forever = False
        self.last_epoch = 0
        self.epochs: dict[int, int] = {}
        self.register_calls: list[tuple[int, object, str]] = []
        self.allocate_calls: list[tuple[int, int]] = []
        self.returned: list[tuple[int, int]] = []
        self.in_flight = 0
        self.cancelled = 0
        self.clock = clock
        self.allocate_delay_s = allocate_delay_s  # advances a FakeClock: an outage the client hid

    async def register_broker(self, broker_id, incarnation_id=None, listener=""):
        self.register_calls.append((broker_id, incarnation_id, listener))
        self.last_epoch += 1
        self.epochs[broker_id] = self.last_epoch
        return self.last_epoch

    async def allocate(self, broker_id, broker_epoch):
        self.allocate_calls.append((broker_id, broker_epoch))
        self.in_flight += 1
        try:
            action = self.script.popleft() if self.script else (HANG if self.hang_forever else None)
            if action == HANG:
                await asyncio.Event().wait()
            if isinstance(action, BaseException):
                raise action
            if self.epochs.get(broker_id) != broker_epoch:
                raise StaleBrokerEpochError(f"broker {broker_id} epoch {broker_epoch}")
            if self.clock is not None and self.allocate_delay_s:
                self.clock.t += self.allocate_delay_s
            if isinstance(action, tuple):
                start, length = action
            else:
                start, length = self.next, self.block_size
                self.next += length
            self.returned.append((start, length))
            return AllocatedBlock(start, length, 0, "fake")
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.in_flight -= 1


class FakeClock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


class SleepRecorder:
    """An injected ``sleep``: records each delay and returns at once."""

    def __init__(self):
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        await asyncio.sleep(0)


async def settle(rounds: int = 50) -> None:
    """Let the refill task run whatever it can run without time passing."""
    for _ in range(rounds):
        await asyncio.sleep(0)


async def take(mgr: ProducerIdManager, n: int, timeout: float = 5.0) -> list[int]:
    """n IDs, retrying load-in-progress like a client does (with a deadline)."""
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        try:
            out.append(mgr.generate_producer_id())
        except CoordinatorLoadInProgressError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.0005)
    return out


def fixed(**kw) -> PidManagerConfig:
    """Kafka-like: one block in reserve, fetched at 90 % use; tests override what they need."""
    return PidManagerConfig.kafka_fixed_threshold(**kw)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


# ------------------------------------------------------------------------ IDs
def test_ids_are_consecutive_and_unique_across_block_boundaries():
    async def go():
        q = FakeQuorum(block_size=7)
        mgr = ProducerIdManager(1, q, config=PidManagerConfig(max_prefetch_blocks=3))
        await mgr.start()
        ids = await take(mgr, 700)
        st = mgr.stats()
        await mgr.close()
        return ids, st, q
    ids, st, q = run(go())
    assert ids == list(range(700))
    assert st["counters"]["generated"] == 700
    assert st["counters"]["blocks_fetched"] >= 100
    assert st["counters"]["blocks_rejected"] == 0


def test_ids_follow_gaps_between_blocks_and_stay_inside_blocks():
    async def go():
        q = FakeQuorum()
        q.script.extend([(0, 5), (100, 5), (1000, 3), (5000, 5)])
        mgr = ProducerIdManager(1, q, config=fixed())
        await mgr.start()
        ids = await take(mgr, 18)
        await mgr.close()
        return ids
    ids = run(go())
    assert ids == [0, 1, 2, 3, 4, 100, 101, 102, 103, 104, 1000, 1001, 1002, 5000, 5001, 5002, 5003, 5004]


def test_generate_is_plain_synchronous():
    assert not asyncio.iscoroutinefunction(ProducerIdManager.generate_producer_id)


def test_generate_never_blocks_when_the_quorum_never_answers():
    async def go():
        q = FakeQuorum(block_size=10)
        mgr = ProducerIdManager(1, q, config=PidManagerConfig(max_prefetch_blocks=4))
        await mgr.start()
        q.hang_forever = True  # every allocate from now on never returns
        ids, slowest = [], 0.0

        def gen():
            nonlocal slowest
            t0 = time.perf_counter()
            ids.append(mgr.generate_producer_id())
            slowest = max(slowest, time.perf_counter() - t0)
        for _ in range(9):
            gen()  # the 9th leaves 1 ID (10 %): the refill task asks for a block, which never comes
        await until(lambda: q.in_flight == 1, what="an allocate in flight")
        gen()
        refusals = []
        for _ in range(3):
            t0 = time.perf_counter()
            with pytest.raises(CoordinatorLoadInProgressError):
                mgr.generate_producer_id()
            refusals.append(time.perf_counter() - t0)
        st = mgr.stats()
        await mgr.close()
        return ids, slowest, refusals, st, q
    ids, slowest, refusals, st, q = run(go())
    assert ids == list(range(10))
    assert slowest < 0.05 and max(refusals) < 0.05  # no waiting for the quorum (generous for a busy CI box)
    assert st["counters"]["load_in_progress"] == 3
    assert q.in_flight == 0 and q.cancelled == 1  # close() cancelled the hanging call


def test_no_block_yet_is_load_in_progress():
    mgr = ProducerIdManager(1, FakeQuorum())
    with pytest.raises(CoordinatorLoadInProgressError):
        mgr.generate_producer_id()
    assert mgr.stats()["counters"]["load_in_progress"] == 1


# ------------------------------------------------------------------ prefetch
def test_kafka_threshold_prefetches_at_90_percent_of_the_block():
    async def go():
        q = FakeQuorum(block_size=100)
        mgr = ProducerIdManager(1, q, config=fixed())
        await mgr.start()
        await settle()
        calls_at_start = len(q.allocate_calls)
        for _ in range(89):
            mgr.generate_producer_id()
        await settle()
        calls_at_89 = len(q.allocate_calls)
        mgr.generate_producer_id()  # the 90th: 10 % left
        await until(lambda: len(q.allocate_calls) == 2, what="the prefetch")
        await settle()
        st = mgr.stats()
        await mgr.close()
        return calls_at_start, calls_at_89, st
    at_start, at_89, st = run(go())
    assert at_start == 1 and at_89 == 1
    assert st["queued_blocks"] == [[100, 100]]  # one block in reserve, no more
    assert st["target_reserve_ids"] == 10


def test_reserve_grows_with_demand_and_is_capped():
    """Injected clock: one window at 50 IDs/s, then windows at 5,000 IDs/s."""
    async def go():
        clock = FakeClock()
        q = FakeQuorum(block_size=100)
        cfg = PidManagerConfig(failover_budget_s=2.0, rate_window_s=0.005, max_prefetch_blocks=500)
        mgr = ProducerIdManager(1, q, config=cfg, clock=clock)
        await mgr.start()
        targets = {}

        async def window(ids_per_s: int) -> None:
            await take(mgr, ids_per_s)
            clock.t += 1.0
            n = len(mgr._rate_windows)
            await until(lambda: len(mgr._rate_windows) > n, what="a rate window to close")
            await until(lambda: mgr.reserve_ids > mgr.target_reserve or
                        len(mgr._queue) >= cfg.max_prefetch_blocks, what="the reserve to reach its target")

        await window(0)
        await window(50)
        targets["low"] = mgr.stats()
        await window(5000)
        targets["high"] = mgr.stats()
        await mgr.close()

        capped = ProducerIdManager(2, FakeQuorum(block_size=100), clock=clock,
                                   config=PidManagerConfig(failover_budget_s=2.0, rate_window_s=0.005,
                                                           max_prefetch_blocks=4))
        await capped.start()
        await take(capped, 5000)
        clock.t += 1.0
        await until(lambda: capped.rate_estimate > 0, what="a rate window")
        await until(lambda: len(capped._queue) == 4, what="the queue to fill")
        await settle()
        targets["capped"] = capped.stats()
        await capped.close()
        return targets
    t = run(go())
    low, high, capped = t["low"], t["high"], t["capped"]
    assert low["rate_peak_per_s"] == pytest.approx(50)
    assert low["target_reserve_ids"] == 100  # 50/s x 2 s (= 10 % of a block would be only 10)
    assert high["rate_last_window_per_s"] == pytest.approx(5000)
    assert high["target_reserve_ids"] == 10_000  # peak 5,000/s x 2 s
    assert high["reserve_ids"] > 10_000 and high["queued_block_count"] >= 99
    assert capped["queued_block_count"] == 4 and capped["target_reserve_ids"] == 400
    assert capped["counters"]["blocks_fetched"] < 60  # 5,000 IDs + a queue of 4, not a runaway


def test_a_surge_in_demand_raises_the_reserve_before_the_window_ends():
    """Window 1 s; 600 IDs in 0.2 s (3,000/s) close it early, and the reserve follows."""
    async def go():
        clock = FakeClock()
        q = FakeQuorum(block_size=100)
        mgr = ProducerIdManager(1, q, clock=clock, config=PidManagerConfig(
            failover_budget_s=2.0, rate_window_s=1.0, max_prefetch_blocks=200))
        await mgr.start()
        await until(lambda: mgr._win_start_t is not None, what="the first window to open")
        await take(mgr, 500)
        clock.t += 0.2
        await take(mgr, 100)  # crosses the 10 % mark: the refill task wakes and samples
        await until(lambda: mgr._rate_windows, what="the surge window")
        await until(lambda: mgr.reserve_ids > mgr.target_reserve, what="the reserve to follow")
        st = mgr.stats()
        await mgr.close()
        return st
    st = run(go())
    assert st["counters"]["surge_windows"] == 1
    assert 2400 <= st["rate_last_window_per_s"] <= 3100  # 500-600 IDs in 0.2 s
    assert st["target_reserve_ids"] >= 5000 and st["reserve_ids"] > st["target_reserve_ids"]


def test_failover_budget_learns_from_a_long_wait_for_a_block():
    """An allocate that took 3 s (a failover the client hid behind its retries) -> budget 4.5 s."""
    async def go():
        clock = FakeClock()
        q = FakeQuorum(block_size=100, clock=clock)
        mgr = ProducerIdManager(1, q, clock=clock, config=PidManagerConfig(failover_budget_s=2.0))
        await mgr.start()
        before = mgr.failover_budget()
        q.allocate_delay_s = 3.0
        await take(mgr, 100)  # spend the block: the next fetch "takes" 3 s
        await until(lambda: mgr.stats()["counters"]["blocks_fetched"] >= 2, what="the slow block")
        after = mgr.failover_budget()
        clock.t += 601  # outside outage_memory_s: back to the configured budget
        later = mgr.failover_budget()
        await mgr.close()
        return before, after, later
    before, after, later = run(go())
    assert before == 2.0 and after == pytest.approx(4.5) and later == 2.0


# ------------------------------------------------------------- block checks
GOOD = (1000, 10)


@pytest.mark.parametrize("first, bad, why", [
    ((0, 10), (9, 10), "start == last ID held (KAFKA-20031)"),
    ((0, 10), (3, 10), "start < last ID held"),
    ((0, 10), (0, 10), "the same block again"),
    (None, (-5, 10), "negative start"),
    (None, (100, 0), "length 0"),
    (None, (100, -10), "negative length"),
    (None, (LONG_MAX - 5, 10), "passes 2**63-1"),
    (None, (LONG_MAX, 1), "starts at 2**63-1"),
])
def test_a_bad_block_is_refused_and_never_used(first, bad, why, caplog):
    async def go():
        q = FakeQuorum()
        if first:
            q.script.append(first)
        q.script.extend([bad, GOOD])
        sleeps = SleepRecorder()
        mgr = ProducerIdManager(1, q, config=fixed(), sleep=sleeps)
        await mgr.start()
        ids = await take(mgr, (first[1] if first else 0) + GOOD[1])
        st = mgr.stats()
        await mgr.close()
        return ids, st, sleeps
    with caplog.at_level(logging.ERROR, logger="broker.pid_manager"):
        ids, st, sleeps = run(go())
    allowed = set(range(GOOD[0], GOOD[0] + GOOD[1])) | (set(range(first[0], first[0] + first[1])) if first else set())
    assert set(ids) <= allowed and len(set(ids)) == len(ids), why
    assert ids[-GOOD[1]:] == list(range(GOOD[0], GOOD[0] + GOOD[1]))
    assert st["counters"]["blocks_rejected"] == 1
    assert len(sleeps.delays) == 1  # backed off before asking again
    refused = [r.getMessage() for r in caplog.records if "refused block" in r.getMessage()]
    assert len(refused) == 1 and f"start={bad[0]} length={bad[1]}" in refused[0]


def test_a_block_below_a_queued_block_is_refused():
    """The check is against the newest block held (queued), not only the current one."""
    async def go():
        q = FakeQuorum()
        q.script.extend([(0, 10), (10, 10), (15, 10), (20, 10)])
        # Reserve target = one whole block: [10, 20) is queued as soon as [0, 10) is current, and
        # the next fetch happens when [0, 10) is spent while [10, 20) is still queued.
        cfg = PidManagerConfig(adaptive=False, prefetch_threshold=0.0, max_prefetch_blocks=3)
        mgr = ProducerIdManager(1, q, config=cfg, sleep=SleepRecorder())
        await mgr.start()
        await until(lambda: mgr.stats()["queued_blocks"] == [[10, 10]], what="[10, 20) queued")
        ids = [mgr.generate_producer_id() for _ in range(10)]
        await until(lambda: mgr.stats()["counters"]["blocks_fetched"] == 3, what="the block after the bad one")
        st = mgr.stats()
        ids += await take(mgr, 20)
        await mgr.close()
        return ids, st
    ids, st = run(go())
    assert ids == list(range(30))
    # [15, 25) starts above the current block's last ID (9) but inside the queued one: refused.
    assert st["counters"]["blocks_rejected"] == 1
    assert st["current_block"]["last_id"] == 9 and st["queued_blocks"] == [[10, 10], [20, 10]]


@pytest.mark.parametrize("block", [(LONG_MAX - 10, 10), (LONG_MAX - 1, 1)])
def test_the_last_possible_block_is_accepted(block):
    async def go():
        q = FakeQuorum()
        q.script.append(block)
        mgr = ProducerIdManager(1, q, config=fixed())
        await mgr.start()
        ids = [mgr.generate_producer_id() for _ in range(block[1])]
        await mgr.close()
        return ids
    ids = run(go())
    assert ids[-1] == LONG_MAX - 1


# ------------------------------------------------------------------- errors
@pytest.mark.parametrize("error", [StaleBrokerEpochError, BrokerIdNotRegisteredError])
def test_stale_epoch_re_registers_with_the_same_incarnation_then_retries(error):
    async def go():
        q = FakeQuorum()
        mgr = ProducerIdManager(1, q, listener="PLAINTEXT://h:9092", config=fixed(), sleep=SleepRecorder())
        await mgr.start()
        first_epoch = mgr.broker_epoch
        q.script.append(error("epoch fenced"))
        ids = await take(mgr, 20)
        st = mgr.stats()
        await mgr.close()
        return first_epoch, ids, st, q, mgr
    first_epoch, ids, st, q, mgr = run(go())
    assert ids == list(range(20))
    assert len(q.register_calls) == 2
    assert {c[1] for c in q.register_calls} == {mgr.incarnation_id}
    assert all(c[2] == "PLAINTEXT://h:9092" for c in q.register_calls)
    assert st["broker_epoch"] == 2 != first_epoch
    assert q.allocate_calls[-1] == (1, 2)
    assert st["counters"]["re_registrations"] == 1
    assert st["counters"]["fetch_errors"] == {error.__name__: 1}


def test_a_registration_the_quorum_lost_is_recovered():
    """The quorum forgot the broker (epoch mismatch from the quorum's own check)."""
    async def go():
        q = FakeQuorum()
        mgr = ProducerIdManager(1, q, config=fixed(), sleep=SleepRecorder())
        await mgr.start()
        q.epochs.clear()
        ids = await take(mgr, 25)
        await mgr.close()
        return ids, q
    ids, q = run(go())
    assert ids == list(range(25)) and len(q.register_calls) == 2


@pytest.mark.parametrize("error", [ClusterAuthorizationFailedError, TopicAuthorizationFailedError,
                                   TransactionalIdAuthorizationFailedError])
def test_authorization_failure_is_fatal(error, caplog):
    async def go():
        q = FakeQuorum(block_size=10)
        mgr = ProducerIdManager(1, q, config=fixed(), sleep=SleepRecorder())
        await mgr.start()
        q.script.append(error("no CLUSTER_ACTION"))
        ids = [mgr.generate_producer_id() for _ in range(10)]  # the block in hand is still served
        await until(lambda: mgr.fatal_error is not None, what="the fatal error")
        calls = len(q.allocate_calls)
        raised = []
        for _ in range(3):
            with pytest.raises(PidQuorumError) as ei:
                mgr.generate_producer_id()
            raised.append(ei.value)
        await settle()
        st = mgr.stats()
        calls_after = len(q.allocate_calls)
        await mgr.close()
        return ids, raised, st, calls, calls_after, mgr
    with caplog.at_level(logging.ERROR, logger="broker.pid_manager"):
        ids, raised, st, calls, calls_after, mgr = run(go())
    assert ids == list(range(10))
    assert all(type(e) is error for e in raised)  # not load-in-progress
    assert isinstance(mgr.fatal_error, error)
    assert calls == calls_after == 2  # refilling stopped
    assert st["counters"]["load_in_progress"] == 0 and st["counters"]["fatal_refusals"] == 3
    assert any(r.levelno == logging.ERROR and "not authorized (KIP-730: fatal)" in r.getMessage()
               for r in caplog.records)


def test_authorization_failure_at_registration_fails_start():
    class Refusing(FakeQuorum):
        async def register_broker(self, broker_id, incarnation_id=None, listener=""):
            raise ClusterAuthorizationFailedError("denied")

    async def go():
        mgr = ProducerIdManager(1, Refusing())
        with pytest.raises(ClusterAuthorizationFailedError):
            await mgr.start()
        return mgr
    mgr = run(go())
    assert mgr.stats()["closed"] and mgr.fatal_error is not None


def test_start_times_out_when_no_block_comes():
    async def go():
        q = FakeQuorum()
        q.script.extend(NotControllerError("no leader") for _ in range(10_000))
        mgr = ProducerIdManager(1, q, config=PidManagerConfig(start_timeout_s=0.3, backoff_max_s=0.05))
        t0 = time.monotonic()
        with pytest.raises(RequestTimedOutError):
            await mgr.start()
        return time.monotonic() - t0, mgr
    took, mgr = run(go())
    assert 0.25 <= took < 5 and mgr.stats()["closed"]


def test_backoff_is_reset_only_by_an_accepted_block():
    """Refused block, stale epoch (+ successful re-registration), refused block, error: the
    delay doubles each time; an accepted block resets it to the initial value."""
    async def go():
        q = FakeQuorum(block_size=10)
        sleeps = SleepRecorder()
        cfg = fixed(backoff_initial_s=0.05, backoff_max_s=5.0, backoff_jitter=0.0)
        mgr = ProducerIdManager(1, q, config=cfg, sleep=sleeps)
        await mgr.start()
        q.script.extend([(5, 10),                     # refused: below the last ID held
                         StaleBrokerEpochError("x"),  # re-registers successfully
                         (9, 1),                      # refused again
                         UnknownServerError("y")])    # then a block is accepted
        ids = await take(mgr, 20)
        after_block = list(sleeps.delays)
        q.script.append(NotControllerError("z"))
        ids += await take(mgr, 10)
        st = mgr.stats()
        await mgr.close()
        return ids, after_block, sleeps.delays, st
    ids, after_block, delays, st = run(go())
    assert ids == list(range(30))
    assert after_block == pytest.approx([0.05, 0.1, 0.2, 0.4])
    assert delays == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.05])
    assert st["counters"]["re_registrations"] == 1 and st["counters"]["blocks_rejected"] == 2


def test_backoff_grows_to_the_cap_with_jitter():
    async def go():
        q = FakeQuorum(block_size=10)
        sleeps = SleepRecorder()
        cfg = fixed(backoff_initial_s=0.05, backoff_max_s=1.0, backoff_jitter=0.2)
        mgr = ProducerIdManager(1, q, config=cfg, sleep=sleeps, rng=random.Random(7))
        await mgr.start()
        q.script.extend(NotControllerError("no leader") for _ in range(12))
        ids = await take(mgr, 20)
        await mgr.close()
        return ids, sleeps.delays
    ids, delays = run(go())
    assert ids == list(range(20)) and len(delays) == 12
    for i, d in enumerate(delays):
        base = min(1.0, 0.05 * 2 ** i)
        assert base * 0.8 <= d <= min(1.0, base * 1.2)
    assert delays[-1] <= 1.0 and delays[-1] >= 0.8


def test_close_cancels_cleanly_and_ids_in_hand_stay_usable():
    async def go():
        q = FakeQuorum(block_size=10)
        await ProducerIdManager(9, q).close()  # never started: nothing to stop
        mgr = ProducerIdManager(1, q, config=fixed())
        await mgr.start()
        q.hang_forever = True
        for _ in range(9):
            mgr.generate_producer_id()
        await until(lambda: q.in_flight == 1, what="an allocate in flight")
        task = mgr._task
        await asyncio.wait_for(mgr.close(), 2.0)
        await mgr.close()  # idempotent
        last = mgr.generate_producer_id()
        with pytest.raises(CoordinatorLoadInProgressError):
            mgr.generate_producer_id()
        others = [t for t in asyncio.all_tasks() if t.get_name().startswith("pid-refill")]
        return task, last, q, others
    task, last, q, others = run(go())
    assert task.cancelled() and q.cancelled == 1 and q.in_flight == 0
    assert last == 9 and others == []


def test_config_validation_and_kafka_preset():
    with pytest.raises(ValueError):
        PidManagerConfig(prefetch_threshold=1.0)
    with pytest.raises(ValueError):
        PidManagerConfig(max_prefetch_blocks=0)
    k = PidManagerConfig.kafka_fixed_threshold()
    assert (k.adaptive, k.max_prefetch_blocks, k.failover_budget_s, k.prefetch_threshold) == (False, 1, 0.0, 0.9)


# -------------------------------------------------------------- integration
def test_two_managers_on_a_real_cluster_hand_out_distinct_ids_inside_quorum_blocks(cluster):
    n = 5000

    async def go():
        clients = [cluster.client(timeout=20), cluster.client(timeout=20)]
        managers = [ProducerIdManager(b, c, listener=f"PLAINTEXT://127.0.0.1:{9090 + b}")
                    for b, c in zip((1, 2), clients)]
        try:
            await asyncio.gather(*(m.start() for m in managers))

            async def demand(m):
                out = []
                while len(out) < n:
                    out += await take(m, 50, timeout=20)
                    await asyncio.sleep(0)  # interleave the two brokers
                return out
            got = await asyncio.gather(*(demand(m) for m in managers))
            stats = [m.stats() for m in managers]
        finally:
            for m in managers:
                await m.close()
            for c in clients:
                await c.close()
        return got, stats
    (ids1, ids2), stats = run(go())
    cluster.lc.down(timeout=10)  # the audit trails are complete once the nodes are stopped
    trails = [cluster.lc.data_dir(x.node_id) + "/audit.log" for x in cluster.lc.nodes()]
    blocks = list(iter_blocks(trails))
    assert len(ids1) == len(ids2) == n
    assert len(set(ids1) | set(ids2)) == 2 * n
    for broker_id, ids, st in ((1, ids1, stats[0]), (2, ids2, stats[1])):
        mine = sorted((b["producer_id_start"], b["producer_id_start"] + b["producer_id_len"])
                      for b in blocks if b["broker_id"] == broker_id)
        assert mine, f"no blocks for broker {broker_id} in the audit trail"
        starts = [s for s, _ in mine]
        for pid in ids:
            i = bisect.bisect_right(starts, pid) - 1
            assert i >= 0 and mine[i][0] <= pid < mine[i][1], f"ID {pid} is in no block of broker {broker_id}"
        assert ids == sorted(ids)
        assert st["counters"]["blocks_rejected"] == 0
