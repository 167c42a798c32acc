"""``pidctl --quorum ADDRS blocks history``: the block history from the nodes themselves (BlockHistoryRequest on
their client port, each node reading its own audit trail), against a local cluster of real processes: the same
JSON as reading the nodes' files, across a snapshot a node installed (its trail has a gap the others fill),
a page at a time, and refused to a principal without DESCRIBE on the cluster when ACLs are on."""
from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

from cli.common import EXIT_OK, EXIT_REFUSED
from cli.main import cli
from quorum.client.quorum import QuorumClient, RetryPolicy
from quorum.localcluster import LocalCluster
from quorum.trail import iter_blocks
from quorum.security import acl as a
from tests.conftest import wait_for
from tests.security.conftest import secure_quorum  # noqa: F401 - the SASL_SSL quorum fixture

PIDCTL = os.path.join(os.path.dirname(sys.executable), "pidctl")


@pytest.fixture
def pidctl(tmp_path, request):
    data_dir = str(tmp_path / "pq")
    runner = CliRunner()

    def invoke(*args, expect=EXIT_OK):
        r = runner.invoke(cli, ["--data-dir", data_dir, "--timeout", "15", *args])
        assert expect is None or r.exit_code == expect, (r.exit_code, r.output, r.exception)
        return r

    invoke.data_dir = data_dir
    invoke.lc = LocalCluster(data_dir)
    yield invoke
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        for n in invoke.lc.nodes():
            print(f"----- node {n.node_id} log -----\n{invoke.lc.tail_log(n.node_id, 40)}")
    invoke.lc.down(timeout=5)


def register(pidctl, broker_id: int) -> int:
    return json.loads(pidctl("broker", "register", "--broker-id", str(broker_id), "-o", "json").stdout)["broker_epoch"]


def allocate(pidctl, broker_id: int, epoch: int, count: int = 1) -> None:
    pidctl("allocate", "--broker-id", str(broker_id), "--broker-epoch", str(epoch), "--count", str(count))


def remote(data_dir: str, quorum: str, *extra: str) -> subprocess.CompletedProcess:
    """``pidctl --quorum ... blocks history -o json`` as a user runs it (stdout and stderr apart)."""
    return subprocess.run([PIDCTL, "--data-dir", data_dir, "--quorum", quorum, "--timeout", "15", "blocks",
                           "history", "-o", "json", *extra], capture_output=True, text=True, timeout=60)


def trail(data_dir: str, node_id: int) -> str:
    return os.path.join(data_dir, f"node-{node_id}", "audit.log")


def node_history(address: str, **kwargs):
    async def go():
        c = QuorumClient([address], RetryPolicy(timeout=10, attempt_timeout=5))
        try:
            return await c.node_block_history(address, **kwargs)
        finally:
            await c.close()
    return asyncio.run(go())


def test_the_nodes_answer_what_their_files_hold_across_a_snapshot_install(pidctl):
    pidctl("cluster", "up")
    lc = pidctl.lc
    e1, e2 = register(pidctl, 1), register(pidctl, 2)
    allocate(pidctl, 1, e1, 2)
    allocate(pidctl, 2, e2, 1)
    addresses = lc.client_addresses()
    quorum = ",".join(addresses)
    # Node 3 misses entries that the others then compact away: started again, it installs a snapshot and
    # its trail has a gap there (an AuditGap line); the other two trails hold those blocks.
    lc.stop(3)
    allocate(pidctl, 1, e1, 3)
    allocate(pidctl, 2, e2, 2)
    pidctl("--quorum", ",".join(addresses[:2]), "snapshot", "take")
    allocate(pidctl, 1, e1, 1)
    lc.start(3)
    lc.wait_ready([3])
    allocate(pidctl, 2, e2, 1)
    n3 = wait_for(lambda: (lambda h: h if h.gaps and h.blocks and h.blocks[-1]["producer_id_start"] ==
                           node_history(addresses[0]).blocks[-1]["producer_id_start"] else None)(
                      node_history(addresses[2])), 30, what="node 3 to install the snapshot and catch up")
    ((after, upto),) = n3.gaps

    files = list(iter_blocks([trail(pidctl.data_dir, i) for i in (1, 2, 3)]))
    assert len(files) == 10
    assert json.loads(pidctl("blocks", "history", "-o", "json").stdout) == files  # the local files
    r = remote(pidctl.data_dir, quorum)
    assert r.returncode == EXIT_OK, r.stderr
    assert json.loads(r.stdout) == files
    said = r"node {} \({}\) through raft index (\d+) \(applied (\d+)\)"
    line = re.fullmatch(r"from " + ", ".join(said.format(i + 1, re.escape(x)) for i, x in enumerate(addresses)),
                        r.stderr.strip())
    assert line is not None, r.stderr
    assert all(int(line[i]) <= int(line[i + 1]) for i in (1, 3, 5))  # a trail is written as its node applies
    assert int(line[5]) >= n3.trail_index
    assert "warning" not in r.stderr

    # Node 3 alone: its trail lacks what it installed through the snapshot, and the answer says so.
    hidden = [b for b in files if after < b["raft_index"] <= upto]
    assert hidden
    r = remote(pidctl.data_dir, addresses[2])
    assert r.returncode == EXIT_OK, r.stderr
    assert json.loads(r.stdout) == [b for b in files if b not in hidden]
    assert (f"warning: raft indexes {after + 1}..{upto} are in no answering node's trail (a snapshot installed "
            f"over them): blocks issued there are not listed") in r.stderr

    # A node down: the others answer, and the line says which one did not.
    lc.stop(2)
    r = remote(pidctl.data_dir, quorum, "--broker-id", "2")
    assert r.returncode == EXIT_OK, r.stderr
    assert json.loads(r.stdout) == [b for b in files if b["broker_id"] == 2]
    assert f"warning: {addresses[1]} did not answer (" in r.stderr and "its trail is not read" in r.stderr
    lc.stop(1)
    lc.stop(3)
    r = remote(pidctl.data_dir, quorum)
    assert r.returncode == 3 and r.stdout == ""
    assert r.stderr.strip().splitlines()[-1].startswith("error: no node answered: ")
    assert "Traceback" not in r.stderr


def test_a_nodes_trail_a_page_at_a_time(pidctl):
    pidctl("cluster", "up")
    epoch = register(pidctl, 1)
    allocate(pidctl, 1, epoch, 7)
    addresses = pidctl.lc.client_addresses()
    for node in (1, 2):  # the pages are read from node 1, then from node 1 and node 2
        wait_for(lambda: len(list(iter_blocks([trail(pidctl.data_dir, node)]))) == 7, 15, what=f"node {node} to apply")
    files = list(iter_blocks([trail(pidctl.data_dir, 1)]))

    async def pages(address: str, limit: int, switch_to: str | None = None):
        c = QuorumClient(addresses, RetryPolicy(timeout=10, attempt_timeout=5))
        try:
            out = [await c.block_history(address, limit=limit)]
            while out[-1].more:
                # ``switch_to``: the next pages from another node, with this node's cursor (its offset a hint)
                out.append(await c.block_history(switch_to or address, out[-1].cursor, limit))
            return out
        finally:
            await c.close()

    ps = asyncio.run(pages(addresses[0], 2))
    assert [len(p.blocks) for p in ps] == [2, 2, 2, 1]
    assert [b for p in ps for b in p.blocks] == files
    assert all(p.node_id == 1 and p.trail_index >= files[-1]["raft_index"] for p in ps)
    assert [p.more for p in ps] == [True, True, True, False]
    ps = asyncio.run(pages(addresses[0], 3, switch_to=addresses[1]))
    assert [b for p in ps for b in p.blocks] == files and [p.node_id for p in ps] == [1, 2, 2]
    # more blocks than the CLI's page would show in one: the whole node, page after page
    assert node_history(addresses[0], page=2).blocks == files


def test_a_principal_without_describe_on_the_cluster_is_refused(secure_quorum):  # noqa: F811
    sq = secure_quorum

    def pidctl(*args, user="alice"):
        r = CliRunner().invoke(cli, [*sq.cli_args(user), *args], catch_exceptions=False)
        return r.exit_code, r.stdout, r.output

    code, _, out = pidctl("blocks", "history", "-o", "json")
    assert code == EXIT_REFUSED, out
    assert out.strip().splitlines() == [
        f"error: {sq.addresses[0]}: User:alice is not allowed DESCRIBE or CLUSTER_ACTION on the cluster "
        "(BlockHistoryRequest)"], out
    sq.grant([a.Acl("User:alice", a.CLUSTER, a.CLUSTER_NAME, a.LITERAL, a.DESCRIBE, a.ALLOW)])

    def answered():
        code, stdout, out = pidctl("blocks", "history", "-o", "json")
        return (code, stdout) if code == EXIT_OK else None
    code, stdout = wait_for(answered, 15, what="every node to apply alice's ACL")
    assert isinstance(json.loads(stdout), list)
    code, stdout, _ = pidctl("blocks", "history", "-o", "json", user="admin")  # a super user
    assert code == EXIT_OK and json.loads(stdout) == json.loads(pidctl("blocks", "history", "-o", "json")[1])
