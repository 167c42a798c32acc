"""`pidctl migrate from-zk` against a real quorum (and a real ZooKeeper for --zk): the first
quorum block starts at ZooKeeper's block_end + 1; every malformed export is refused with a
message naming the field and nothing written; running it twice, or below what the quorum
issued, changes nothing."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from quorum.client.quorum import QuorumClient, RetryPolicy
from quorum.localcluster import LocalCluster, free_ports
from quorum.trail import read_audit
from records.wire.errors import InvalidRequestError
from tests.conftest import run
from tests.migration.conftest import REPO, pidctl, three_node_quorum

LONG_MAX = 2**63 - 1


@pytest.fixture(scope="module")
def quorum(tmp_path_factory):
    yield from three_node_quorum(tmp_path_factory.mktemp("seed") / "cluster")


@pytest.fixture
def fresh_quorum(tmp_path):
    yield from three_node_quorum(tmp_path / "cluster")


def export(tmp_path, content) -> str:
    path = tmp_path / "latest_producer_id_block.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


def next_id(lc: LocalCluster) -> int:
    async def go():
        c = QuorumClient(lc.client_addresses(), RetryPolicy(timeout=10))
        try:
            # the leader's: it applied every entry it answered (node 1 may be a follower a little behind)
            return (await c.find_leader())[1]["state"]["next_producer_id"]
        finally:
            await c.close()
    return run(go())


def first_block(lc: LocalCluster, broker_id: int = 1) -> int:
    async def go():
        c = QuorumClient(lc.client_addresses(), RetryPolicy(timeout=10))
        try:
            epoch = await c.register_broker(broker_id)
            return (await c.allocate(broker_id, epoch)).start
        finally:
            await c.close()
    return run(go())


def seeds_in_audit(lc: LocalCluster) -> list:
    lines, _ = read_audit(os.path.join(lc.data_dir(1), "audit.log"))
    return [ln.record for ln in lines if ln.record is not None and ln.record.SPEC.name == "ProducerIdSeedRecord"]


EXAMPLE = {"version": 1, "broker": 35, "block_start": "4000", "block_end": "4999"}


def test_seed_from_an_export_then_first_block_starts_after_block_end(fresh_quorum, tmp_path):
    path = export(tmp_path, EXAMPLE)
    dry = pidctl(fresh_quorum, "migrate", "from-zk", "--export", path, "--dry-run", "-o", "json")
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["would_change"] is True
    assert next_id(fresh_quorum) == 0  # a dry run commits nothing
    r = pidctl(fresh_quorum, "migrate", "from-zk", "--export", path, "-o", "json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["changed"] is True and out["seed"] == 5000 and out["next_producer_id"] == 5000
    assert first_block(fresh_quorum) == 5000  # block_end + 1, not block_start (KAFKA-15552)
    again = pidctl(fresh_quorum, "migrate", "from-zk", "--export", path)
    assert again.returncode == 0 and "nothing changed" in again.stdout
    assert next_id(fresh_quorum) == 6000
    (seed,) = seeds_in_audit(fresh_quorum)
    assert seed.origin == f"export:{path}" and (seed.zk_block_start, seed.zk_block_end, seed.zk_broker) == (
        4000, 4999, 35)


def one_line_error(r: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def test_a_quorum_that_issued_ids_is_not_seeded_over_them(fresh_quorum, tmp_path):
    # Issue 38: `pidctl demo` (blocks from 0), then the runbook with a ZooKeeper far above: the seed
    # used to go on and leave the demo's blocks inside ZooKeeper's range.
    for _ in range(3):
        first_block(fresh_quorum)  # [0, 3000)
    path = export(tmp_path, {**EXAMPLE, "block_start": "99000", "block_end": "99999"})
    status = pidctl(fresh_quorum, "migrate", "status")
    assert status.returncode == 0 and "issued producer IDs from 0 before any seed (not fresh" in status.stdout
    expected = ("error: the quorum already issued producer IDs 0..2999, which overlap ZooKeeper's range 0..99999; "
                "seed only a fresh quorum (docs/migration.md)")
    for dry in (["--dry-run"], []):
        r = pidctl(fresh_quorum, "migrate", "from-zk", "--export", path, *dry)
        assert r.returncode == 4, (r.returncode, r.stdout, r.stderr)
        assert one_line_error(r) == expected and r.stdout == ""
    assert next_id(fresh_quorum) == 3000
    assert seeds_in_audit(fresh_quorum) == []


def test_a_seed_below_what_the_quorum_issued_before_it_is_refused(fresh_quorum, tmp_path):
    for _ in range(6):
        first_block(fresh_quorum)  # [0, 6000): the ZooKeeper block's 0..4999 among them
    r = pidctl(fresh_quorum, "migrate", "from-zk", "--export", export(tmp_path, EXAMPLE), "-o", "json")
    assert r.returncode == 4 and r.stdout == ""
    assert one_line_error(r).startswith("error: the quorum already issued producer IDs 0..5999, which overlap "
                                        "ZooKeeper's range 0..4999;")
    assert next_id(fresh_quorum) == 6000
    assert seeds_in_audit(fresh_quorum) == []


def test_the_leader_refuses_an_overlapping_seed_without_the_cli_preflight(fresh_quorum):
    # An older pidctl (or another client) sends the seed straight away: the leader's state decides.
    first_block(fresh_quorum)

    async def go():
        c = QuorumClient(fresh_quorum.client_addresses(), RetryPolicy(timeout=10))
        try:
            return await c.seed(100_000, "export:zk.json", 35, 99_000, 99_999)
        finally:
            await c.close()
    with pytest.raises(InvalidRequestError, match=r"issued producer IDs 0\.\.999, which overlap ZooKeeper's"):
        run(go())
    assert next_id(fresh_quorum) == 1000


def test_status_says_whether_the_quorum_is_fresh(fresh_quorum, tmp_path):
    r = pidctl(fresh_quorum, "migrate", "status", "-o", "json")
    assert r.returncode == 0
    assert json.loads(r.stdout)["producer_ids_issued"] == {"lowest": None, "before_seed": False, "seeded": False}
    r = pidctl(fresh_quorum, "migrate", "status")
    assert r.stdout.strip() == ("migration mode: none; next producer ID 0; no producer ID issued yet (a fresh quorum: "
                                "it may be seeded)")
    assert pidctl(fresh_quorum, "migrate", "from-zk", "--export", export(tmp_path, EXAMPLE)).returncode == 0
    r = pidctl(fresh_quorum, "migrate", "status")
    assert r.stdout.strip() == "migration mode: none; next producer ID 5000; seeded, no producer ID issued yet"
    first_block(fresh_quorum)
    r = pidctl(fresh_quorum, "migrate", "status")
    assert r.stdout.strip() == ("migration mode: none; next producer ID 6000; issued producer IDs from 5000, all "
                                "after its seed")
    assert json.loads(pidctl(fresh_quorum, "migrate", "status", "-o", "json").stdout)["producer_ids_issued"] == {
        "lowest": 5000, "before_seed": False, "seeded": True}


@pytest.mark.parametrize("content,field", [
    ("{not json", "data"),
    ("[1, 2]", "data"),
    ("", "data"),
    ({"broker": 35, "block_start": "4000", "block_end": "4999"}, "version"),
    ({"version": 1, "block_start": "4000", "block_end": "4999"}, "broker"),
    ({"version": 1, "broker": 35, "block_end": "4999"}, "block_start"),
    ({"version": 1, "broker": 35, "block_start": "4000"}, "block_end"),
    ({**EXAMPLE, "version": 2}, "version"),
    ({**EXAMPLE, "version": "1"}, "version"),
    ({**EXAMPLE, "broker": "35"}, "broker"),
    ({**EXAMPLE, "broker": 35.5}, "broker"),
    ({**EXAMPLE, "block_start": 4000}, "block_start"),
    ({**EXAMPLE, "block_start": "4000.0"}, "block_start"),
    ({**EXAMPLE, "block_end": "4e3"}, "block_end"),
    ({**EXAMPLE, "block_end": "abc"}, "block_end"),
    ({**EXAMPLE, "block_start": "-1000"}, "block_start"),
    ({**EXAMPLE, "block_end": str(LONG_MAX + 1)}, "block_end"),
    ({**EXAMPLE, "block_start": "5000", "block_end": "4999"}, "block_end"),
], ids=lambda v: v if isinstance(v, str) and len(v) < 20 else None)
def test_malformed_exports_are_refused_naming_the_field_and_nothing_is_written(quorum, tmp_path, content, field):
    before = next_id(quorum)
    r = pidctl(quorum, "migrate", "from-zk", "--export", export(tmp_path, content))
    assert r.returncode == 1, (r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"'{field}'" in lines[0], lines[0]
    assert next_id(quorum) == before
    assert seeds_in_audit(quorum) == []


def test_missing_export_file_and_bad_usage(quorum, tmp_path):
    r = pidctl(quorum, "migrate", "from-zk", "--export", str(tmp_path / "nope.json"))
    assert r.returncode == 1 and "No such file" in r.stderr
    r = pidctl(quorum, "migrate", "from-zk")
    assert r.returncode == 2 and "exactly one of" in r.stderr


# ------------------------------------------------------------------ live ZooKeeper
def test_seed_from_live_zookeeper(fresh_quorum, zk_chroot, zk_client):
    zk_client.create("/latest_producer_id_block", json.dumps({**EXAMPLE, "block_start": "9000",
                                                              "block_end": "9999"}).encode())
    r = pidctl(fresh_quorum, "migrate", "from-zk", "--zk", zk_chroot, "-o", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["seed"] == 10_000
    assert first_block(fresh_quorum) == 10_000
    (seed,) = seeds_in_audit(fresh_quorum)
    assert seed.origin == f"zookeeper:{zk_chroot}"


def test_missing_znode_is_refused_unless_allowed(quorum, zk_chroot):
    before = next_id(quorum)
    r = pidctl(quorum, "migrate", "from-zk", "--zk", zk_chroot)
    assert r.returncode == 1 and "does not exist" in r.stderr and "--allow-empty" in r.stderr
    r = pidctl(quorum, "migrate", "from-zk", "--zk", zk_chroot, "--allow-empty")
    assert r.returncode == 0 and "nothing to seed" in r.stdout
    assert next_id(quorum) == before


def test_malformed_znode_is_refused(quorum, zk_chroot, zk_client):
    zk_client.create("/latest_producer_id_block", b'{"version":1,"broker":35,"block_start":"4000"}')
    r = pidctl(quorum, "migrate", "from-zk", "--zk", zk_chroot)
    assert r.returncode == 1 and "'block_end'" in r.stderr


def test_unreachable_zookeeper_is_one_line_and_exit_unavailable(quorum):
    nobody = f"127.0.0.1:{free_ports(1)[0]}"
    r = subprocess.run([sys.executable, "-m", "cli.main", "--quorum", ",".join(quorum.client_addresses()),
                        "--timeout", "2", "migrate", "from-zk", "--zk", nobody],
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 3, (r.returncode, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), r.stderr
