"""``QuorumClient(prefer_leader=True)``: calls go to the leader, found in the background, and follow it
when it changes; a follower would answer by forwarding, a second hop on every call."""
from __future__ import annotations

import asyncio
import functools
import time

from quorum.client.quorum import QuorumClient
from quorum.client.retry import RetryPolicy
from tests.conftest import run
from tests.support.loop import until


_until = functools.partial(until, interval=0.05)


def _leader_last(cluster) -> tuple[list[str], str]:
    leader = cluster.leader()
    node_of = {n.node_id: n.client_address for n in cluster.lc.nodes()}
    return [a for i, a in sorted(node_of.items()) if i != leader] + [node_of[leader]], node_of[leader]


def test_calls_move_to_the_leader_and_follow_it_when_it_changes(cluster):
    addresses, leader = _leader_last(cluster)

    async def go():
        c = QuorumClient(addresses, RetryPolicy(timeout=20, attempt_timeout=2), prefer_leader=True)
        try:
            epoch = await c.register_broker(1)
            first = await c.allocate(1, epoch)
            assert first.node == addresses[0]  # a follower answered (forwarded) while the leader was looked for
            await _until(lambda: c.addresses[c._preferred] == leader, 10, "the client to prefer the leader")
            assert (await c.allocate(1, epoch)).node == leader
            cluster.lc.kill(next(n.node_id for n in cluster.lc.nodes() if n.client_address == leader))
            new_leader = await asyncio.to_thread(cluster.leader, 20)
            new_address = next(n.client_address for n in cluster.lc.nodes() if n.node_id == new_leader)
            await c.allocate(1, epoch)  # moves off the dead node, then looks for the leader again
            await _until(lambda: c.addresses[c._preferred] == new_address, 10, "the client to follow the new leader")
            assert (await c.allocate(1, epoch)).node == new_address
            assert c.leader_moves >= 1  # the first move; after the kill the retry itself may land on the leader
        finally:
            await c.close()
    run(go())


def test_without_prefer_leader_the_client_stays_on_the_node_that_answered(cluster):
    addresses, leader = _leader_last(cluster)

    async def go():
        c = QuorumClient(addresses, RetryPolicy(timeout=20, attempt_timeout=2))
        try:
            epoch = await c.register_broker(1)
            nodes = {(await c.allocate(1, epoch)).node for _ in range(20)}
            assert nodes == {addresses[0]} and leader not in nodes
        finally:
            await c.close()
    run(go())


def test_a_client_that_starts_before_the_election_moves_to_the_leader_once_there_is_one():
    """The first look for the leader found only followers (the cluster was still electing): the client
    asks again until a node leads, rather than forwarding every call for LEADER_RECHECK_S."""
    addresses = ["a:1", "b:2", "c:3"]

    def raft(state, term, leader):
        return {"raft": {"state": state, "term": term, "leader": leader, "self": "raft-" + state}}

    async def go():
        c = QuorumClient(addresses, RetryPolicy(timeout=20, attempt_timeout=2), prefer_leader=True)
        rounds = []

        async def describe_each(addrs=None):
            rounds.append(time.monotonic())
            if len(rounds) < 4:  # still electing
                return {a: raft("follower", 1, None) for a in addresses}
            return {"a:1": raft("follower", 2, "raft-leader"), "b:2": raft("follower", 2, "raft-leader"),
                    "c:3": {"raft": {"state": "leader", "term": 2, "leader": "raft-leader", "self": "raft-leader"}}}

        c.describe_each = describe_each
        c._look_for_leader()
        first_look = c._leader_task
        await _until(lambda: c.addresses[c._preferred] == "c:3", 3, "the client to prefer the leader")
        assert c.leader_moves == 1 and len(rounds) == 4
        assert c._leader_task is first_look  # the first look kept asking; no later look (5 s on) was needed
        await c.close()
    run(go())
