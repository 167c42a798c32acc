"""Node replacement on a real three-node quorum: a wiped node is refused, a restored one held back; a dead
member is replaced by a fresh node (remove-node, add-node) that catches up; leadership moves."""
from __future__ import annotations

import json
import os
import shutil

from click.testing import CliRunner

from cli.main import cli
from quorum.client.leader import pick_leader
from quorum.client.quorum import QuorumClient, RetryPolicy
from quorum.identity import EXIT_IDENTITY_REFUSED, PEERS_FILE, NodeIdentity
from quorum.raft import configuration_before
from snapshots.storage.disk import Disk
from tests.conftest import run, wait_for


def pidctl(lc, *args):
    result = CliRunner().invoke(cli, ["--data-dir", lc.dir, "--timeout", "15", *args])
    return result.exit_code, result.output


def allocate(addresses, n):
    async def go():
        c = QuorumClient(addresses, RetryPolicy(timeout=20.0, attempt_timeout=2.0))
        try:
            epoch = await c.register_broker(1)
            return [await c.allocate(1, epoch) for _ in range(n)]
        finally:
            await c.close()
    return run(go())


def assert_unique(blocks):
    spans = sorted((b.start, b.start + b.length) for b in blocks)
    for (s1, e1), (s2, _) in zip(spans, spans[1:]):
        assert e1 <= s2, f"overlapping blocks {s1}..{e1} and {s2}"


def wait_refused_exit(lc, node_id, timeout=20.0):
    pid = next(n.pid for n in lc.nodes() if n.node_id == node_id)
    code = lc._procs[pid].wait(timeout)
    assert code == EXIT_IDENTITY_REFUSED, lc.tail_log(node_id)
    return lc.tail_log(node_id, 50)


def caught_up(cluster, node_id):
    d = cluster.describe_all()
    leader = d.get(pick_leader(d))
    if leader is None or node_id not in d:
        return False
    if d[node_id]["raft"]["state"] == "leader":
        return True
    raft_address = d[node_id]["raft"]["self"]
    peer = leader["raft"]["peers"].get(raft_address)
    return peer and peer["connected"] and peer["match_index"] >= leader["raft"]["commit_index"]


def test_wiped_follower_is_refused_then_replaced_and_old_leader_killed(cluster):
    lc = cluster.lc
    blocks = allocate(lc.client_addresses(), 20)
    leader = cluster.leader()
    victim = next(n for n in lc.nodes() if n.node_id != leader)

    # The follower loses its data directory and comes back under its old name: refused.
    lc.kill(victim.node_id)
    shutil.rmtree(lc.data_dir(victim.node_id))
    lc.start(victim.node_id)
    log = wait_refused_exit(lc, victim.node_id)
    assert "its data directory was lost or replaced" in log and "remove-node" in log
    blocks += allocate(lc.client_addresses(), 5)  # the two others serve on

    # Replace it: remove the dead member, start a fresh node, add it; it catches up.
    code, out = pidctl(lc, "quorum", "remove-node", victim.raft_address, "-o", "json")
    assert code == 0, out
    assert victim.raft_address not in json.loads(out)["members"]
    lc.mark_removed(victim.node_id)
    fresh = lc.add_node_config()
    lc.start(fresh.node_id)
    lc.wait_ready([fresh.node_id])
    code, out = pidctl(lc, "quorum", "add-node", fresh.raft_address, "--client-address", fresh.client_address,
                       "-o", "json")
    assert code == 0, out
    added = json.loads(out)
    assert added["caught_up"] and fresh.raft_address in added["members"] and len(added["members"]) == 3

    # Kill the old leader: the survivor and the new node elect, allocations go on, all unique.
    old_leader = cluster.leader()
    lc.kill(old_leader)
    live = [n.client_address for n in lc.nodes() if not n.removed and n.node_id != old_leader]
    blocks += allocate(live, 20)
    assert_unique(blocks)
    assert cluster.leader() != old_leader
    # The new node holds the same state as the leader (a follower applies once the commit index reaches it:
    # with the next AppendEntries, at most a few milliseconds after the leader).
    wait_for(lambda: caught_up(cluster, fresh.node_id), 15, what="the new node caught up")
    wait_for(lambda: len({v["state"]["next_producer_id"] for v in cluster.describe_all().values()}) == 1, 15,
             what="every node applied the same state")


def test_restored_old_backup_is_held_back_until_it_caught_up(cluster):
    lc = cluster.lc
    allocate(lc.client_addresses(), 5)
    leader = cluster.leader()
    victim = next(n for n in lc.nodes() if n.node_id != leader)
    backup = os.path.join(lc.dir, "backup")
    lc.stop(victim.node_id)
    shutil.copytree(lc.data_dir(victim.node_id), backup)
    # It runs on (a new generation, seen by its peers) and acknowledges more entries.
    lc.start(victim.node_id)
    lc.wait_ready([victim.node_id])
    allocate(lc.client_addresses(), 10)
    wait_for(lambda: caught_up(cluster, victim.node_id), 15, what="the follower caught up")
    lc.kill(victim.node_id)
    shutil.rmtree(lc.data_dir(victim.node_id))
    shutil.copytree(backup, lc.data_dir(victim.node_id))
    lc.start(victim.node_id)
    # Its peers saw it hold more than the copy has: it comes back as a member that neither votes nor
    # counts toward a majority until its log is back where it was (decided by log position).
    wait_for(lambda: "may have lost entries it acknowledged" in lc.tail_log(victim.node_id, 400), 15,
             what="the restored node to know it is behind")
    wait_for(lambda: "votes and counts toward a majority again" in lc.tail_log(victim.node_id, 400), 15,
             what="the restored node to catch up")
    assert_unique(allocate(lc.client_addresses(), 5))


def test_add_node_refused_while_a_member_is_down_and_leader_not_removable(cluster):
    lc = cluster.lc
    leader = cluster.leader()
    leader_info = next(n for n in lc.nodes() if n.node_id == leader)
    code, out = pidctl(lc, "quorum", "remove-node", leader_info.raft_address)
    assert code == 4 and "transfer-leadership" in out
    victim = next(n for n in lc.nodes() if n.node_id != leader)
    lc.kill(victim.node_id)
    fresh = lc.add_node_config()
    lc.start(fresh.node_id)
    lc.wait_ready([fresh.node_id])
    code, out = pidctl(lc, "quorum", "add-node", fresh.raft_address, "--client-address", fresh.client_address)
    assert code == 4 and "not connected or not caught up" in out, out
    # A node that does not run is never added.
    code, out = pidctl(lc, "quorum", "add-node", "127.0.0.1:1", "--client-address", "127.0.0.1:1")
    assert code == 3 and "start it first" in out, out


def test_transfer_leadership(cluster):
    lc = cluster.lc
    allocate(lc.client_addresses(), 3)
    before = cluster.leader()
    target = next(n for n in lc.nodes() if n.node_id != before)
    code, out = pidctl(lc, "quorum", "transfer-leadership", target.raft_address, "-o", "json")
    assert code == 0, out
    assert json.loads(out)["leader"] == target.raft_address
    assert cluster.leader() == target.node_id
    allocate(lc.client_addresses(), 3)


def test_identities_survive_a_graceful_restart_of_every_node(cluster):
    """A clean stop is not a membership change: every node keeps what it learnt of its peers, so a node
    wiped while the whole cluster was down is still refused when they all come back."""
    lc = cluster.lc
    allocate(lc.client_addresses(), 3)
    nodes = lc.nodes()
    for n in nodes:  # every node has checked the hello of both others
        wait_for(lambda n=n: len(NodeIdentity._load_peers(Disk(), os.path.join(lc.data_dir(n.node_id), PEERS_FILE))) == 2,
                 15, what=f"node {n.node_id} to know both peers")
    lc.down()
    for n in nodes:
        known = NodeIdentity._load_peers(Disk(), os.path.join(lc.data_dir(n.node_id), PEERS_FILE))
        assert set(known) == {m.raft_address for m in nodes if m is not n}, (n.node_id, known)
    victim = nodes[2]
    shutil.rmtree(lc.data_dir(victim.node_id))
    for n in nodes:
        lc.start(n.node_id)
    log = wait_refused_exit(lc, victim.node_id)
    assert "its data directory was lost or replaced" in log


def test_the_configuration_before_later_changes_undoes_them_newest_first():
    now = ["a", "b", "c"]
    assert configuration_before(now, []) == now
    # after the snapshot's index: c added, then d removed
    assert sorted(configuration_before(now, [("add", "c"), ("rem", "d")])) == ["a", "b", "d"]
    # d added and removed again: it was not there before either
    assert sorted(configuration_before(now, [("add", "d"), ("rem", "d")])) == now
    # d removed, then added back: there before
    assert sorted(configuration_before(now + ["d"], [("rem", "d"), ("add", "d")])) == ["a", "b", "c", "d"]
    # the leader removed after the index (seed 400136): the configuration at the index still has it
    assert sorted(configuration_before(["c", "b"], [("rem", "d")])) == ["b", "c", "d"]
    assert configuration_before(now, [("version", "x")]) == now
