"""broker.pid_manager.ProducerIdManager when the quorum fails (errors, hangs, refusals) against a fake
quorum, and one integration test against a real three-node cluster."""
from __future__ import annotations

import asyncio
import bisect
import logging
import random
import time

import pytest

from broker.pid_manager import PidManagerConfig, ProducerIdManager
from quorum.trail import iter_blocks
from tests.support.loop import until
from records.wire.errors import (
    BrokerIdNotRegisteredError,
    ClusterAuthorizationFailedError,
    CoordinatorLoadInProgressError,
    NotControllerError,
    PidQuorumError,
    RequestTimedOutError,
    StaleBrokerEpochError,
    TransactionalIdAuthorizationFailedError,
    UnknownServerError,
)
from tests.broker.fake_quorum import FakeQuorum, SleepRecorder, TopicAuthorizationFailedError, fixed, run, settle, take


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
