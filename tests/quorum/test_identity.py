"""Unit tests for quorum.identity: the data-dir identity and the peers' checks (no Raft)."""
from __future__ import annotations

import logging

import pytest

from quorum.errors import CorruptFileError
from quorum.identity import IDENTITY_FILE, Hello, IdentityError, NodeIdentity, derived_cluster_id

ADDR = "10.0.0.3:9093"


def test_generation_rises_on_every_start_and_uuid_is_kept(tmp_path):
    a = NodeIdentity.open(str(tmp_path), "s", "c-1")
    b = NodeIdentity.open(str(tmp_path), "s", "c-1")
    assert a.hello.generation == 1
    assert b.hello.node_uuid == a.hello.node_uuid
    assert b.hello.generation == a.hello.generation + 1
    assert b.hello.run != a.hello.run


def test_config_cluster_id_must_match_the_data_dir(tmp_path):
    NodeIdentity.open(str(tmp_path), "s", "c-1")
    with pytest.raises(IdentityError, match="belongs to cluster c-1"):
        NodeIdentity.open(str(tmp_path), "s", "c-2")
    # No cluster_id in the config: the stored one is kept.
    assert NodeIdentity.open(str(tmp_path), "s", None).cluster_id == "c-1"


def test_legacy_data_dir_gets_an_identity_with_a_log_line(tmp_path, caplog):
    (tmp_path / "raft.journal").write_bytes(b"PQJRNL\x00\x01")
    with caplog.at_level(logging.WARNING, logger="quorum.identity"):
        ident = NodeIdentity.open(str(tmp_path), "the secret")
    assert ident.cluster_id == derived_cluster_id("the secret") != derived_cluster_id("another")
    assert "written by an earlier version" in caplog.text and ident.cluster_id in caplog.text
    assert "the secret" not in ident.cluster_id


def test_damaged_identity_file_is_refused(tmp_path):
    NodeIdentity.open(str(tmp_path), "s", "c-1")
    path = tmp_path / IDENTITY_FILE
    data = bytearray(path.read_bytes())
    data[-6] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptFileError, match="checksum"):
        NodeIdentity.open(str(tmp_path), "s", "c-1")


def _hello(node="n1", gen=1, run="r1", cluster="c-1"):
    return Hello(cluster, node, gen, run, "10.0.0.3:9092")


def test_checks_and_durable_knowledge(tmp_path):
    me = NodeIdentity.open(str(tmp_path), "s", "c-1")
    assert me.check(ADDR, _hello()) is None                      # first sight: recorded
    assert me.check(ADDR, _hello()) is None                      # same run reconnecting
    assert "another cluster" in me.check(ADDR, _hello(cluster="c-9"))
    assert "lost or replaced" in me.check(ADDR, _hello(node="n2"))   # wiped data dir: new uuid
    assert me.check(ADDR, _hello(gen=2, run="r2")) is None       # a normal restart
    assert "older copy" in me.check(ADDR, _hello(gen=1, run="r3"))   # a backup from before
    assert "older copy" in me.check(ADDR, _hello(gen=2, run="r9"))   # the same generation started twice
    # The knowledge survives a restart of this node.
    again = NodeIdentity.open(str(tmp_path), "s", "c-1")
    assert again.known_peers()[ADDR] == {"node": "n1", "gen": 2, "run": "r2"}
    assert "older copy" in again.check(ADDR, _hello(gen=2, run="r3"))
    # Removed from the cluster: a fresh node may be added at the address.
    again.forget(ADDR)
    assert again.check(ADDR, _hello(node="n5")) is None


@pytest.mark.parametrize("message", [{}, {"cluster": "c", "node": "n", "run": "r", "gen": 0},
                                     {"cluster": "c", "node": "n", "run": "r", "gen": True},
                                     {"cluster": 1, "node": "n", "run": "r", "gen": 1},
                                     {"cluster": "c", "node": "", "run": "r", "gen": 1}])
def test_malformed_hello(message):
    with pytest.raises(ValueError):
        Hello.from_message(message)
