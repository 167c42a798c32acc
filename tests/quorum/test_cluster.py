"""Integration: three real node processes on loopback."""
from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess

import pytest

from quorum.client.quorum import QuorumClient, RetryPolicy
from quorum import localcluster
from quorum.localcluster import ClusterError, LocalCluster
from tests.conftest import run, wait_for


def assert_disjoint(blocks):
    ranges = sorted((b.start, b.next_id) for b in blocks)
    for (s1, e1), (s2, e2) in zip(ranges, ranges[1:]):
        assert s2 >= e1, f"blocks overlap: [{s1},{e1}) and [{s2},{e2})"


def test_two_brokers_allocate_concurrently_get_disjoint_blocks(cluster):
    async def go():
        c1, c2 = cluster.client(), cluster.client()
        e1, e2 = await c1.register_broker(1), await c2.register_broker(2)
        assert e2 > e1

        async def loop(c, b, e):
            return [await c.allocate(b, e) for _ in range(40)]
        got = await asyncio.gather(loop(c1, 1, e1), loop(c2, 2, e2))
        await c1.close()
        await c2.close()
        return got
    b1, b2 = run(go())
    assert_disjoint(b1 + b2)
    for blocks in (b1, b2):  # per broker, blocks increase
        assert [b.start for b in blocks] == sorted(b.start for b in blocks)
        assert all(b.length == 1000 for b in blocks)


def test_kill_leader_allocation_continues_and_restarted_node_catches_up(cluster):
    c = cluster.client()
    epoch = run(c.register_broker(7))
    before = run(c.allocate(7, epoch))
    leader = cluster.leader()
    cluster.lc.kill(leader)
    after = [run(c.allocate(7, epoch)) for _ in range(5)]
    assert all(b.start >= before.next_id for b in after)
    assert_disjoint([before] + after)
    cluster.lc.start(leader)
    cluster.lc.wait_ready([leader])

    def caught_up():
        d = cluster.describe_all()
        return (len(d) == 3 and len({x["state"]["next_producer_id"] for x in d.values()}) == 1
                and d[leader]["state"]["next_producer_id"] == after[-1].next_id)
    wait_for(caught_up, 15, what="the restarted node to catch up")


def test_whole_cluster_kill_and_restart_next_block_is_above_every_acknowledged_one(cluster):
    c = cluster.client()
    epoch = run(c.register_broker(3))
    acked = [run(c.allocate(3, epoch)) for _ in range(20)]
    for n in cluster.lc.nodes():
        cluster.lc.kill(n.node_id)
    cluster.lc.up()
    c2 = cluster.client(timeout=20)
    nxt = run(c2.allocate(3, epoch))
    assert nxt.start >= max(b.next_id for b in acked)


def test_follower_forwards_to_leader(cluster):
    leader = cluster.leader()
    follower = next(n for n in cluster.lc.nodes() if n.node_id != leader)
    c = QuorumClient([follower.client_address], RetryPolicy(timeout=5))
    epoch = run(c.register_broker(11))
    b = run(c.allocate(11, epoch))
    assert b.node == follower.client_address and b.length == 1000
    assert cluster.describe_all()[follower.node_id]["server"]["forwarded"] >= 2


def test_restored_backup_of_a_follower_is_held_back_until_it_caught_up(cluster):
    """Real processes: a copy of a follower's data directory taken while it runs (a nightly backup) is
    restored after it is killed.  Its peers saw it hold more: it must not vote or count until its log is
    back there, and once the leader is killed too no acknowledged block is issued again."""
    c = cluster.client()
    epoch = run(c.register_broker(5))
    acked = [run(c.allocate(5, epoch)) for _ in range(3)]
    leader = cluster.leader()
    follower = next(n.node_id for n in cluster.lc.nodes() if n.node_id != leader)
    data = cluster.lc.data_dir(follower)
    backup = data + ".backup"
    shutil.copytree(data, backup)
    acked += [run(c.allocate(5, epoch)) for _ in range(6)]
    cluster.lc.kill(follower)
    shutil.rmtree(data)
    shutil.copytree(backup, data)
    cluster.lc.start(follower)
    cluster.lc.wait_ready([follower])
    wait_for(lambda: "may have lost entries it acknowledged" in cluster.lc.tail_log(follower, 400), 15,
             what="the restored node to know it is behind")
    wait_for(lambda: "votes and counts toward a majority again" in cluster.lc.tail_log(follower, 400), 15,
             what="the restored node to catch up")
    cluster.lc.kill(leader)
    fresh = [run(cluster.client(timeout=20).allocate(5, epoch)) for _ in range(3)]
    assert min(b.start for b in fresh) >= max(b.next_id for b in acked)
    assert_disjoint(acked + fresh)


def test_sigterm_with_open_client_connections_stops_cleanly(cluster):
    """A node stopping while clients are connected ends quietly: no task failure in its log."""
    node = cluster.lc.nodes()[0]
    host, port = node.client_address.rsplit(":", 1)
    socks = [socket.create_connection((host, int(port)), timeout=5) for _ in range(3)]
    try:
        c = cluster.client()
        run(c.register_broker(3))  # the node is serving
        run(c.close())
        cluster.lc.stop(node.node_id)
        assert not cluster.lc.alive(node.node_id)
    finally:
        for s in socks:
            s.close()
    with open(cluster.lc.log_path(node.node_id)) as f:
        text = f.read()
    assert "Traceback" not in text, text[-3000:]


def test_start_waits_for_a_dying_process_instead_of_taking_it_for_the_node(tmp_path):
    """After kill -9 a node's cmdline reads empty while it still dies; start() must not take that
    process (or the stale ready file) for a running node, but wait for it and start a new one."""
    lc = LocalCluster(str(tmp_path / "c"))
    lc.up(3)
    try:
        lc.kill(1)
        dying = subprocess.Popen(["sleep", "0.5"])  # alive, not our node: as a process in its exit
        state = lc.load()
        next(n for n in state["nodes"] if n["node_id"] == 1)["pid"] = dying.pid
        lc._save(state)
        open(os.path.join(lc.dir, "node-1.ready"), "w").close()  # left by the first run
        pid = lc.start(1)
        assert pid != dying.pid and lc._our_pid(1) == pid
        lc.wait_ready([1])
        dying.wait()
    finally:
        lc.down()


def _hold_port() -> socket.socket:
    """A port another process holds: bound and listening until closed."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def test_up_creates_the_cluster_again_on_other_ports_when_a_node_finds_its_port_taken(tmp_path, monkeypatch):
    """free_ports releases the ports it picks; another process may take one before the node binds it.
    up() then discards the cluster it just created and creates it on other ports."""
    held = _hold_port()
    taken = held.getsockname()[1]
    real, calls = localcluster.free_ports, []

    def first_with_a_taken_port(n, host="127.0.0.1"):
        ports = real(n, host)
        calls.append(ports)
        if len(calls) == 1:
            ports[4] = taken  # node 3's Raft port
        return ports

    monkeypatch.setattr(localcluster, "free_ports", first_with_a_taken_port)
    lc = LocalCluster(str(tmp_path / "c"))
    try:
        lc.up(3)
        assert len(calls) == 2
        nodes = lc.nodes()
        assert all(lc.alive(n.node_id) for n in nodes)
        assert all(not n.raft_address.endswith(f":{taken}") for n in nodes)
        with open(lc.log_path(3)) as f:
            assert "cannot bind" not in f.read()  # the failed attempt's log went with its cluster
    finally:
        lc.down()
        held.close()


def test_a_failed_up_stops_the_nodes_it_started(tmp_path, monkeypatch):
    """A cluster that existed before up() is not created again: up() raises, and no node it started
    outlives the failure."""
    held = _hold_port()
    lc = LocalCluster(str(tmp_path / "c"))
    lc.create(3)
    state = lc.load()
    node3 = next(n for n in state["nodes"] if n["node_id"] == 3)
    with open(lc.config_path(3)) as f:
        text = f.read()
    with open(lc.config_path(3), "w") as f:
        f.write(text.replace(node3["raft_address"], f"127.0.0.1:{held.getsockname()[1]}"))
    try:
        with pytest.raises(ClusterError, match="node 3"):
            lc.up(3, timeout=20)
        pids = [n.pid for n in lc.nodes()]
        assert all(pids) and not any(lc.alive(n.node_id) for n in lc.nodes())
        assert lc.load()["nodes"][0]["raft_address"] == state["nodes"][0]["raft_address"]  # not re-created
    finally:
        lc.down()
        held.close()


def test_up_never_discards_a_new_cluster_that_issued_a_block(tmp_path, monkeypatch):
    """A node that cannot bind a port exits within milliseconds of its Raft port coming up, and a new cluster
    elects no leader before all its nodes gave their word: a block is issued before such a failure only in a
    narrow window.  Made certain here: all three nodes are up, a client (which found the cluster through
    cluster.json) gets a block, and then the start counts as failed on a taken port.  up() raises and keeps
    the cluster: a new one would issue that block again."""
    lc = LocalCluster(str(tmp_path / "c"))
    blocks = []
    original_wait = LocalCluster.wait_ready

    def ready_then_a_block_then_failed(self, node_ids=None, timeout=30.0):
        original_wait(self, node_ids, timeout)
        if blocks:
            return

        async def allocate():
            client = QuorumClient(self.client_addresses(), RetryPolicy(timeout=20, attempt_timeout=5))
            try:
                blocks.append(await client.allocate(1, await client.register_broker(1)))
            finally:
                await client.close()
        run(allocate())
        raise ClusterError("node 3 exited during start-up (made up by the test)")

    monkeypatch.setattr(LocalCluster, "wait_ready", ready_then_a_block_then_failed)
    monkeypatch.setattr(LocalCluster, "_port_taken", lambda self: True)
    assert not lc.exists()
    try:
        with pytest.raises(ClusterError, match="made up by the test"):
            lc.up(3)
        assert len(blocks) == 1
        state = lc.load()  # the same cluster, not another one
        assert any(os.path.getsize(os.path.join(lc.data_dir(n["node_id"]), "audit.log")) for n in state["nodes"])
        assert not any(lc.alive(n.node_id) for n in lc.nodes())  # and the nodes it started are stopped
    finally:
        lc.down()
