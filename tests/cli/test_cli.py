"""pidctl through click's CliRunner, against a real local cluster: the issue's "done means" flow."""
from __future__ import annotations

import json
import os

from cli.common import EXIT_DEGRADED, EXIT_ERROR, EXIT_OK, EXIT_REFUSED, EXIT_UNAVAILABLE, EXIT_USAGE, quorum_health
from quorum.localcluster import LocalCluster
from tests.conftest import wait_for


def test_done_means_flow(pidctl):
    pidctl("cluster", "up")
    r1 = json.loads(pidctl("broker", "register", "--broker-id", "1", "-o", "json").output)
    r2 = json.loads(pidctl("broker", "register", "--broker-id", "2", "-o", "json").output)
    assert r2["broker_epoch"] > r1["broker_epoch"]
    a1 = json.loads(pidctl("allocate", "--broker-id", "1", "--broker-epoch", str(r1["broker_epoch"]),
                           "--count", "3", "-o", "json").output)
    a2 = json.loads(pidctl("allocate", "--broker-id", "2", "--broker-epoch", str(r2["broker_epoch"]),
                           "--count", "3", "-o", "json").output)
    ranges = sorted((b["producer_id_start"], b["next_producer_id"]) for b in a1 + a2)
    assert all(s2 >= e1 for (_, e1), (s2, _) in zip(ranges, ranges[1:]))

    status = json.loads(pidctl("quorum", "status", "-o", "json").output)
    leader = next(n for n in status if n["raft"]["state"] == "leader")
    assert {n["raft"]["term"] for n in status} == {leader["raft"]["term"]}
    LocalCluster(pidctl.data_dir).kill(leader["node_id"])
    a3 = json.loads(pidctl("allocate", "--broker-id", "1", "--broker-epoch", str(r1["broker_epoch"]),
                           "-o", "json").output)
    assert a3[0]["producer_id_start"] >= ranges[-1][1]
    # One node down, a leader serving: degraded (6), and the line says which node is down.
    wait_for(lambda: pidctl("quorum", "status", expect=None).exit_code == EXIT_DEGRADED, 15,
             what="quorum status to say degraded")
    assert f"node {leader['node_id']} " in pidctl("quorum", "status", expect=EXIT_DEGRADED).output

    history = json.loads(pidctl("blocks", "history", "-o", "json").output)
    issued = {(b["producer_id_start"], b["producer_id_len"]) for b in a1 + a2 + a3}
    assert {(b["producer_id_start"], b["producer_id_len"]) for b in history} == issued

    latest = json.loads(pidctl("blocks", "latest", "-o", "json").output)
    assert latest["next_producer_id"] == a3[0]["next_producer_id"]

    LocalCluster(pidctl.data_dir).start(leader["node_id"])
    LocalCluster(pidctl.data_dir).wait_ready()
    wait_for(lambda: all("raft" in n and n["lag"] == 0 and n["state"]["next_producer_id"] == latest["next_producer_id"]
                         for n in json.loads(pidctl("quorum", "status", "-o", "json", expect=None).output)), 15,
             what="all nodes caught up")
    wait_for(lambda: pidctl("quorum", "status", expect=None).exit_code == EXIT_OK, 15, what="a healthy quorum")
    pidctl("snapshot", "take")
    snap = os.path.join(pidctl.data_dir, "node-1", "raft.snapshot")
    info = json.loads(pidctl("snapshot", "inspect", snap, "-o", "json").output)
    blocks = [r for r in info["records"] if r["type"] == "AllocateProducerIdsRecord"]
    assert len(blocks) == 1 and blocks[0]["producer_id_start"] == a3[0]["producer_id_start"]
    assert {r["broker_id"] for r in info["records"] if r["type"] == "RegisterBrokerRecord"} == {1, 2}
    assert "producer_id_start" in pidctl("snapshot", "inspect", snap).output

    pidctl("cluster", "down")
    assert "unavailable" in pidctl("quorum", "status", expect=EXIT_UNAVAILABLE).output  # every node down


def _node(node_id: int, state: str = "follower", leader: str | None = "r1", recovering=None) -> dict:
    return {"node_id": node_id, "client_address": f"c{node_id}",
            "raft": {"self": f"r{node_id}", "state": state, "leader": leader, "recovering": recovering}}


def test_quorum_health_is_healthy_degraded_or_unavailable_as_etcdctl_endpoint_health():
    leader = _node(1, "leader")
    down = {"node_id": 3, "client_address": "c3", "error": "connection refused"}
    code, line = quorum_health([leader, _node(2), _node(3)])
    assert code == EXIT_OK and line.startswith(f"healthy: 3 of 3 nodes up, leader node 1 (c1, Raft {leader['raft']['self']})")
    code, line = quorum_health([leader, _node(2), down])
    assert code == EXIT_DEGRADED and "node 3 (c3) is down" in line
    assert quorum_health([leader, _node(2), _node(3, recovering={"reason": "x"})])[0] == EXIT_DEGRADED
    assert quorum_health([leader, _node(2), _node(3, leader=None)])[0] == EXIT_DEGRADED
    assert quorum_health([leader, down, dict(down, node_id=2)])[0] == EXIT_UNAVAILABLE  # no majority answers
    assert quorum_health([_node(1, leader=None), _node(2, leader=None), _node(3, leader=None)])[0] == EXIT_UNAVAILABLE
    assert quorum_health([leader, _node(2, "leader"), _node(3)])[0] == EXIT_UNAVAILABLE  # two claim to lead
    assert quorum_health([dict(down, node_id=i) for i in (1, 2, 3)])[0] == EXIT_UNAVAILABLE


def test_user_mistakes_are_one_line_with_named_exit_codes(pidctl, tmp_path):
    r = pidctl("blocks", "latest", expect=EXIT_ERROR)
    assert "no cluster" in r.output and "Traceback" not in r.output
    pidctl("allocate", "--broker-id", "1", expect=EXIT_USAGE)
    bad = tmp_path / "bad.snapshot"
    bad.write_bytes(b"PQSNAP\x00\x01garbage")
    r = pidctl("snapshot", "inspect", str(bad), expect=EXIT_ERROR)
    assert str(bad) in r.output and "Traceback" not in r.output
    pidctl("cluster", "up")
    r = pidctl("allocate", "--broker-id", "9", "--broker-epoch", "12345", expect=EXIT_REFUSED)
    assert "STALE_BROKER_EPOCH" in r.output


def test_the_demo_runs_to_its_end(pidctl):
    """README's first command: the demo registers, allocates, shows the quorum's status and says how to stop."""
    out = pidctl("demo").output
    assert "healthy: 3 of 3 nodes up" in out
    assert out.rstrip().splitlines()[-1].startswith("stop it with: pidctl --data-dir")
