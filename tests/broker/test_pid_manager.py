"""broker.pid_manager.ProducerIdManager against a fake quorum: the IDs it hands out, prefetching the next
block, and the checks on each block the quorum returns.  Errors and the real-cluster test are in
test_pid_manager_errors.

Waits are on conditions with deadlines; the only sleeps are the pacing of a demand loop and zero-length
yields to the event loop.
"""
from __future__ import annotations

import asyncio
import logging
import time

import pytest

from broker.pid_manager import LONG_MAX, PidManagerConfig, ProducerIdManager
from tests.support.loop import until
from records.wire.errors import CoordinatorLoadInProgressError
from tests.broker.fake_quorum import FakeClock, FakeQuorum, SleepRecorder, fixed, run, settle, take


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
