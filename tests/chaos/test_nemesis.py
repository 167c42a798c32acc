"""chaos.nemesis against real three-node clusters: each fault starts, heals, and the
quorum keeps allocating disjoint blocks; plus the journal's slow-disk hook and the
deliberately broken allocator (which must really hand a block out twice)."""
from __future__ import annotations

import asyncio
import os
import random
import signal
import statistics
import time

import pytest

from chaos.faultnode import FAULT_NODE_COMMAND, FAULT_SYNC_DELAY_FILE, FaultDisk
from chaos.faults import BROKEN_ALLOCATOR
from chaos.nemesis import (
    SCENARIOS,
    KillAll,
    KillLeader,
    Mixed,
    Nemesis,
    NemesisContext,
    NemesisError,
    PartitionLeader,
    PauseLeader,
    RaftNetwork,
    RollingRestart,
    SlowDisk,
)
from quorum.client.quorum import QuorumClient, RetryPolicy
from quorum.journal import DurableJournal
from quorum.localcluster import LocalCluster
from tests.conftest import run, wait_for
from tests.quorum.test_cluster import assert_disjoint
from records.wire.errors import PidQuorumError


@pytest.fixture
def make_cluster(tmp_path, request):
    """make_cluster(proxy=False, faults=()) -> NemesisContext over a running three-node cluster whose nodes
    have ``faults`` armed (chaos.faults specs)."""
    made: list[tuple[LocalCluster, RaftNetwork | None]] = []

    def make(proxy: bool = False, faults: tuple[str, ...] = ()) -> NemesisContext:
        lc = LocalCluster(str(tmp_path / f"cluster-{len(made)}"))
        command = [*FAULT_NODE_COMMAND, *(a for f in faults for a in ("--failpoint", f))]
        lc.create(3, raft_proxy=proxy, node_command=command)  # as the chaos runner starts nodes
        net = RaftNetwork(lc).start() if proxy else None
        made.append((lc, net))
        lc.up(3)
        return NemesisContext(lc, random.Random(7), network=net)

    yield make
    failed = getattr(request.node, "rep_call", None)
    for lc, net in made:
        for n in lc.nodes():
            lc.signal(n.node_id, signal.SIGCONT)  # a node left paused would stall down()
        if failed is not None and failed.failed:
            for n in lc.nodes():
                print(f"----- node {n.node_id} log -----\n{lc.tail_log(n.node_id, 60)}")
        lc.down(timeout=5)
        if net is not None:
            net.close()


async def until(predicate, timeout: float = 20.0, what: str = "condition"):
    """Await an (async or plain) predicate until it is truthy, or fail at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


class Allocator:
    """One broker allocating in a loop through every node; acknowledged blocks are kept,
    failures counted (a timeout's outcome is unknown: neither success nor failure)."""

    def __init__(self, lc: LocalCluster, broker_id: int):
        self.client = QuorumClient(lc.client_addresses(), RetryPolicy(timeout=20, attempt_timeout=1.0))
        self.broker_id = broker_id
        self.blocks: list = []
        self.failures = 0
        self._stopping = False

    async def __aenter__(self) -> "Allocator":
        self.epoch = await self.client.register_broker(self.broker_id)
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *exc) -> None:
        self._stopping = True  # asyncio.wait_for in 3.11 can swallow a cancel: the loop checks this too
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        await self.client.close()

    async def _loop(self) -> None:
        while not self._stopping:
            try:
                self.blocks.append(await self.client.allocate(self.broker_id, self.epoch))
            except PidQuorumError:
                self.failures += 1
            await asyncio.sleep(0.005)

    async def more(self, n: int, timeout: float = 20.0) -> None:
        target = len(self.blocks) + n
        await until(lambda: len(self.blocks) >= target, timeout, f"{n} more acknowledged blocks")


async def converged(ctx: NemesisContext, timeout: float = 20.0) -> dict[int, dict]:
    """Every node answers, and all agree on commit index, applied index and cursor."""
    async def agree():
        st = await ctx.statuses()
        keys = {(d["raft"]["commit_index"], d["raft"]["last_applied"], d["state"]["next_producer_id"])
                for d in st.values()}
        return st if len(st) == 3 and len(keys) == 1 else None
    return await until(agree, timeout, "every node to agree on the committed state")


def client_address(ctx: NemesisContext, node_id: int) -> str:
    return next(n.client_address for n in ctx.cluster.nodes() if n.node_id == node_id)


# ------------------------------------------------------------------ faults


def test_kill_leader_mid_allocation_then_restart(make_cluster):
    ctx = make_cluster()

    async def go():
        async with Allocator(ctx.cluster, 1) as w:
            await w.more(5)
            nem = KillLeader()
            old = (await nem.start(ctx))["node"]
            assert old is not None and not ctx.cluster.alive(old)
            await ctx.wait_leader(exclude=old)
            await w.more(5)
            assert await nem.stop(ctx) == {"node": old}
            assert ctx.cluster.alive(old)
            await w.more(5)
        assert_disjoint(w.blocks)
        await converged(ctx)
    run(go())


def test_kill_all_then_restart_every_node_issues_only_new_blocks(make_cluster):
    ctx = make_cluster()

    async def go():
        async with Allocator(ctx.cluster, 2) as w:
            await w.more(5)
            nem = KillAll()
            assert (await nem.start(ctx)) == {"nodes": [1, 2, 3]}
            assert not any(ctx.cluster.alive(n) for n in (1, 2, 3))
            before = list(w.blocks)
            healed = await nem.stop(ctx)
            assert healed["nodes"] == [1, 2, 3] and healed["leader"] in (1, 2, 3)
            await w.more(5)
        after = w.blocks[len(before):]
        assert min(b.start for b in after) >= max(b.next_id for b in before)
        assert_disjoint(w.blocks)
        await converged(ctx)
    run(go())


def test_rolling_restart_restarts_every_node_leader_last(make_cluster):
    ctx = make_cluster()

    async def go():
        pids = {n.node_id: n.pid for n in ctx.cluster.nodes()}
        leader = await ctx.wait_leader()
        async with Allocator(ctx.cluster, 3) as w:
            await w.more(3)
            nem = RollingRestart()
            started = await nem.start(ctx)
            assert sorted(started["order"]) == [1, 2, 3] and started["order"][-1] == leader
            assert all(n.pid != pids[n.node_id] for n in ctx.cluster.nodes())
            assert await nem.stop(ctx) == {}
            await w.more(5)
        assert_disjoint(w.blocks)
        await converged(ctx)
    run(go())


def test_pause_leader_a_new_leader_serves_and_the_woken_one_hands_out_nothing_stale(make_cluster):
    ctx = make_cluster()

    async def go():
        async with Allocator(ctx.cluster, 4) as w:
            await w.more(3)
            nem = PauseLeader()
            old = (await nem.start(ctx))["node"]
            assert old is not None
            # A request that waits in the paused leader's socket, to be read when it wakes.
            to_old = QuorumClient([client_address(ctx, old)], RetryPolicy(timeout=15, attempt_timeout=15))
            queued = asyncio.create_task(to_old.allocate(w.broker_id, w.epoch))
            new = await ctx.wait_leader(exclude=old)
            await w.more(5)
            assert not queued.done()
            assert await nem.stop(ctx) == {"node": old}

            async def follows_new_leader():
                st = await ctx.statuses()
                return (old in st and new in st and st[old]["raft"]["state"] == "follower"
                        and st[old]["raft"]["leader"] == st[new]["raft"]["self"])
            await until(follows_new_leader, what=f"node {old} to step down and follow node {new}")
            try:
                late = [await queued]  # answered after waking: must be a block nobody else has
            except PidQuorumError:
                late = []  # refused or timed out: fine too
            top = max(b.next_id for b in w.blocks)
            fresh = await to_old.allocate(w.broker_id, w.epoch)  # forwarded to the new leader
            assert fresh.start >= top
            await to_old.close()
            await w.more(3)
        assert_disjoint(w.blocks + late + [fresh])
        await converged(ctx)
    run(go())


def test_partition_isolated_leader_commits_nothing_majority_goes_on_and_it_catches_up(make_cluster):
    ctx = make_cluster(proxy=True)

    async def go():
        everyone = QuorumClient(ctx.cluster.client_addresses(), RetryPolicy(timeout=20, attempt_timeout=1.0))
        epoch = await everyone.register_broker(5)
        blocks = [await everyone.allocate(5, epoch) for _ in range(3)]
        nem = PartitionLeader()
        started = await nem.start(ctx)
        old = started["node"]
        assert old is not None and started["client_port"] == "reachable"
        cut_at = (await ctx.statuses())[old]

        # The isolated node still answers its client port, but cannot commit anything.
        isolated = QuorumClient([client_address(ctx, old)], RetryPolicy(timeout=3, attempt_timeout=3))
        with pytest.raises(PidQuorumError):
            await isolated.allocate(5, epoch)
        await isolated.close()

        await ctx.wait_leader(exclude=old)
        majority = QuorumClient([client_address(ctx, n) for n in (1, 2, 3) if n != old],
                                RetryPolicy(timeout=20, attempt_timeout=1.0))
        blocks += [await majority.allocate(5, epoch) for _ in range(5)]
        await majority.close()
        status = await ctx.statuses()
        assert await ctx.leader() != old
        assert status[old]["raft"]["commit_index"] == cut_at["raft"]["commit_index"]
        assert status[old]["state"]["next_producer_id"] == blocks[2].next_id
        assert ctx.network.unidentified == 0

        assert await nem.stop(ctx) == {"node": old}
        assert ctx.network.cut == set()
        final = await converged(ctx)
        assert final[old]["state"]["next_producer_id"] == blocks[-1].next_id
        blocks += [await everyone.allocate(5, epoch) for _ in range(3)]
        await everyone.close()
        assert_disjoint(blocks)
    run(go())


def test_slow_disk_slows_allocations_while_on_and_not_after(make_cluster):
    ctx = make_cluster()

    async def go():
        leader = await ctx.wait_leader()
        c = QuorumClient([client_address(ctx, leader)], RetryPolicy(timeout=10, attempt_timeout=5))
        epoch = await c.register_broker(6)

        async def latency() -> float:
            t = time.perf_counter()
            await c.allocate(6, epoch)
            return time.perf_counter() - t

        async def median(n: int = 7) -> float:
            return statistics.median([await latency() for _ in range(n)])

        normal = await median()
        nem = SlowDisk(delay_ms=(80, 80))
        assert await nem.start(ctx) == {"nodes": [leader], "delay_ms": [80, 80]}
        await until(lambda: _took(latency, lambda t: t >= 0.08), 5, "allocations to slow down")  # within 0.1 s
        slow = await median()
        assert await nem.stop(ctx) == {"nodes": [leader]}
        assert not os.path.exists(os.path.join(ctx.cluster.data_dir(leader), FAULT_SYNC_DELAY_FILE))
        await until(lambda: _took(latency, lambda t: t < 0.04), 5, "allocations to be fast again")
        after = await median()
        await c.close()
        assert slow >= 0.08 > normal, (normal, slow)
        assert after < slow / 2, (normal, slow, after)
    run(go())


async def _took(latency, test) -> bool:
    return test(await latency())


def test_broken_allocator_hands_a_client_the_same_block_twice_under_kill_leader(make_cluster):
    ctx = make_cluster(faults=(BROKEN_ALLOCATOR,))

    async def go():
        # A long attempt timeout: under load an abandoned attempt would hide the re-issued answer
        # (the retry goes on to a fresh block), and the test would prove nothing.
        c = QuorumClient(ctx.cluster.client_addresses(), RetryPolicy(timeout=30, attempt_timeout=8.0))
        epoch = await c.register_broker(8)
        # The first leader disarms on its first allocation: no block existed to reuse.
        blocks = [await c.allocate(8, epoch) for _ in range(3)]
        nem = KillLeader()
        await nem.start(ctx)
        blocks += [await c.allocate(8, epoch) for _ in range(3)]
        await nem.stop(ctx)
        await c.close()
        return blocks
    blocks = run(go())
    ranges = [(b.start, b.length) for b in blocks]
    reissued = [r for i, r in enumerate(ranges) if r in ranges[:i]]
    assert reissued, ranges  # normally the new leader's first answer: the last block again
    with pytest.raises(AssertionError, match="overlap"):
        assert_disjoint(blocks)
    logs = "".join(ctx.cluster.tail_log(n, 200) for n in (1, 2, 3))
    assert "UNSAFE" in logs and "for tests only" in logs


def test_heal_all_undoes_every_fault_at_once(make_cluster):
    ctx = make_cluster(proxy=True)

    async def go():
        leader = await ctx.wait_leader()
        a, b = [n for n in (1, 2, 3) if n != leader]
        ctx.network.isolate(leader)
        await ctx.kill(a)
        await ctx.signal(b, signal.SIGSTOP)
        ctx.set_sync_delay(b, (100, 100))
        assert await ctx.heal_all() == {"restarted": [a]}
        assert ctx.network.cut == set()
        assert all(ctx.cluster.alive(n) for n in (1, 2, 3))
        assert not any(os.path.exists(os.path.join(ctx.cluster.data_dir(n), FAULT_SYNC_DELAY_FILE))
                       for n in (1, 2, 3))
        c = QuorumClient(ctx.cluster.client_addresses(), RetryPolicy(timeout=20, attempt_timeout=1.0))
        epoch = await c.register_broker(9)
        blocks = [await c.allocate(9, epoch) for _ in range(3)]
        await c.close()
        assert_disjoint(blocks)
        await converged(ctx)
    run(go())


# --------------------------------------------------------- without a cluster


def test_scenarios_are_the_issue_s_names_and_build_fresh_nemeses():
    assert set(SCENARIOS) == {"kill-leader", "pause-leader", "kill-all", "rolling-restart", "partition-leader",
                              "slow-disk", "mixed"}
    for name, factory in SCENARIOS.items():
        first, second = factory(), factory()
        assert first and all(isinstance(n, Nemesis) for n in first)
        assert [n.name for n in first] == [name]
        assert first[0] is not second[0]  # no state shared between runs


def test_mixed_picks_with_the_context_rng_and_partitions_only_with_a_network(tmp_path):
    lc = LocalCluster(str(tmp_path / "c"))

    def picks(seed: int, network=None) -> list[str]:
        ctx = NemesisContext(lc, random.Random(seed), network=network)
        return [Mixed().pick(ctx).name for _ in range(60)]

    assert picks(3) == picks(3)
    assert "partition-leader" not in picks(3)
    assert set(picks(3)) == {"kill-leader", "pause-leader", "kill-all", "rolling-restart", "slow-disk"}
    assert "partition-leader" in picks(3, network=object())


def test_partition_needs_a_cluster_created_with_a_raft_proxy(tmp_path):
    lc = LocalCluster(str(tmp_path / "c"))
    lc.create(3)
    with pytest.raises(NemesisError, match="raft_proxy=True"):
        RaftNetwork(lc).start()
    with pytest.raises(NemesisError, match="ctx.network"):
        run(PartitionLeader().start(NemesisContext(lc)))


def test_journal_sync_delay_file_is_read_at_run_time(tmp_path):
    """A node started through chaos.faultnode: its disk reads the delay file at run time."""
    journal = DurableJournal(str(tmp_path / "raft.journal"), FaultDisk(str(tmp_path)))
    delay_file = tmp_path / FAULT_SYNC_DELAY_FILE
    index = iter(range(1, 10_000))

    def timed_sync() -> float:
        journal.add(b"x", next(index), 1)
        t = time.perf_counter()
        journal.sync()
        return time.perf_counter() - t

    assert timed_sync() < 0.05
    delay_file.write_text("60-70\n")
    assert wait_for(lambda: timed_sync() >= 0.06, 2, what="syncs to slow down")
    assert timed_sync() >= 0.06
    delay_file.write_text("not a delay\n")
    assert wait_for(lambda: timed_sync() < 0.05, 2, what="a bad file to be ignored")
    delay_file.write_text("60")
    assert wait_for(lambda: timed_sync() >= 0.06, 2, what="syncs to slow down")
    delay_file.unlink()
    assert wait_for(lambda: timed_sync() < 0.05, 2, what="syncs to be fast again")
    journal._destroy()


def test_fault_disk_without_fsync_still_writes_entries_but_never_syncs(tmp_path, monkeypatch):
    """``chaos.faultnode --no-fsync`` (benchmarks only): entries are written, fdatasync is never called."""
    synced = []
    monkeypatch.setattr(os, "fdatasync", lambda fd: synced.append(fd))
    journal = DurableJournal(str(tmp_path / "raft.journal"), FaultDisk(str(tmp_path), fsync=False))
    for i in range(1, 4):
        journal.add(b"x", i, 1)
    journal.sync()
    journal._destroy()
    assert synced == []
    assert [e[1] for e in DurableJournal(str(tmp_path / "raft.journal"), FaultDisk(str(tmp_path))).entries] == [1, 2, 3]
