"""The leader-side block reserve (NodeConfig.allocate_reserve_blocks), on a real three-node cluster.

A block handed out from the reserve must have been committed for that broker and epoch (it is in
every node's audit trail), handed out once, above every earlier block of the broker, and never again
after a leader kill or a re-registration.
"""
from __future__ import annotations

import asyncio
import os

import pytest

from quorum.localcluster import LocalCluster
from quorum.trail import iter_blocks
from tests.conftest import ClusterHarness, cluster_harness, run, wait_for


@pytest.fixture
def reserve_cluster(tmp_path, request):
    yield from cluster_harness(tmp_path, request, allocate_rate_per_broker=0, allocate_reserve_blocks=8)


def audit_blocks(lc: LocalCluster) -> dict[int, tuple[int, int]]:
    """start -> (broker id, broker epoch) of every committed block, from all nodes' trails."""
    paths = [os.path.join(lc.data_dir(n.node_id), "audit.log") for n in lc.nodes()]
    return {b["producer_id_start"]: (b["broker_id"], b["broker_epoch"]) for b in iter_blocks(paths)}


def served_from_reserve(h: ClusterHarness) -> int:
    return sum(d["proposer"]["reserve_served"] for d in h.describe_all().values())


def test_reserve_serves_committed_increasing_blocks_and_survives_leader_kill(reserve_cluster):
    h = reserve_cluster
    c = h.client(timeout=30.0)

    async def alloc(n, broker, epoch):
        return [await c.allocate(broker, epoch) for _ in range(n)]

    epoch = run(c.register_broker(1))
    first = run(alloc(60, 1, epoch))
    assert served_from_reserve(h) > 0, "sequential allocations were never answered from the reserve"
    leader = h.leader()
    h.lc.kill(leader)
    second = run(alloc(40, 1, epoch))  # the new leader has no reserve: it builds its own
    h.lc.start(leader)
    h.lc.wait_ready([leader], 30)
    epoch2 = run(c.register_broker(1))  # a new incarnation: the old epoch's reserve must not be used
    assert epoch2 != epoch
    third = run(alloc(30, 1, epoch2))
    run(c.close())
    blocks = first + second + third
    starts = [b.start for b in blocks]
    assert starts == sorted(starts) and len(set(starts)) == len(starts), "blocks not strictly increasing"
    for a, b in zip(blocks, blocks[1:]):
        assert b.start >= a.next_id, f"overlap: [{a.start},{a.next_id}) then {b.start}"

    def all_committed():
        committed = audit_blocks(h.lc)
        return all(b.start in committed for b in blocks) and committed
    committed = wait_for(all_committed, 20, what="every handed-out block in the audit trails")
    for b in first + second:
        assert committed[b.start] == (1, epoch), f"block {b.start} committed for {committed[b.start]}"
    for b in third:
        assert committed[b.start] == (1, epoch2), f"block {b.start} committed for {committed[b.start]}"


def test_reserve_with_concurrent_brokers_gives_disjoint_blocks(reserve_cluster):
    h = reserve_cluster

    async def go():
        clients = [h.client(timeout=30.0) for _ in range(3)]
        epochs = [await cl.register_broker(i + 1) for i, cl in enumerate(clients)]

        async def loop(i):
            return [await clients[i].allocate(i + 1, epochs[i]) for _ in range(50)]
        got = await asyncio.gather(*(loop(i) for i in range(3)))
        for cl in clients:
            await cl.close()
        return got
    per_broker = run(go())
    ranges = sorted((b.start, b.next_id) for bl in per_broker for b in bl)
    for (s1, e1), (s2, e2) in zip(ranges, ranges[1:]):
        assert s2 >= e1, f"blocks overlap: [{s1},{e1}) and [{s2},{e2})"
    for bl in per_broker:
        assert [b.start for b in bl] == sorted(b.start for b in bl)
    committed = wait_for(lambda: (lambda c: c if all(s in c for s, _ in ranges) else None)(audit_blocks(h.lc)), 20,
                         what="every handed-out block in the audit trails")
    for i, bl in enumerate(per_broker):
        assert all(committed[b.start][0] == i + 1 for b in bl)
