"""Unit tests for quorum.identity: the data-dir identity and the peers' checks (no Raft)."""
from __future__ import annotations

import logging

import pytest

from quorum.identity import IDENTITY_FILE, Hello, IdentityError, NodeIdentity, Verdict, derived_cluster_id
from snapshots.storage.disk import CorruptFileError

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


def _hello(node="n1", gen=1, run="r1", cluster="c-1", log=(1, 10)):
    return Hello(cluster, node, gen, run, "10.0.0.3:9092", log)


def test_verdicts_decide_by_log_position_not_by_start_count(tmp_path):
    me = NodeIdentity.open(str(tmp_path), "s", "c-1")
    v = me.admit(ADDR, _hello())
    assert v.refused is None and v.recover is None and v.new_run          # first sight: recorded
    assert me.admit(ADDR, _hello()) == Verdict()                          # same run reconnecting
    assert "another cluster" in me.admit(ADDR, _hello(cluster="c-9")).refused
    assert "lost or replaced" in me.admit(ADDR, _hello(node="n2")).refused  # wiped data dir: new uuid
    assert me.admit(ADDR, _hello(gen=2, run="r2", log=(1, 12))).recover is None  # a normal restart
    me.note_held(ADDR, (2, 30))                                           # pings / acknowledgements
    assert me.held(ADDR) == (2, 30)
    # A restart whose log is below what it was seen to hold: a restored backup, a journal cut by a
    # fault.  However many times it starts, and whatever start counter it shows, it gets the target.
    for gen, run in ((3, "r3"), (1, "r4"), (99, "r5"), (100, "r6")):
        v = me.admit(ADDR, _hello(gen=gen, run=run, log=(2, 12)))
        assert v.refused is None and v.recover == (2, 30) and v.new_run
    assert me.admit(ADDR, _hello(run="r7", log=(3, 1))).recover is None   # a newer term covers it
    # What was learned survives a restart of this node, and only ever rises.
    again = NodeIdentity.open(str(tmp_path), "s", "c-1")
    assert again.known_peers()[ADDR]["held"] == (3, 1)
    assert again.admit(ADDR, _hello(run="r8", log=(2, 40))).recover == (3, 1)
    # Removed from the cluster: a fresh node may be added at the address.
    again.forget(ADDR)
    assert again.admit(ADDR, _hello(node="n5", log=None)).refused is None


def test_positions_learned_between_restarts_are_written_at_most_lazily(tmp_path):
    me = NodeIdentity.open(str(tmp_path), "s", "c-1")
    me.admit(ADDR, _hello())
    me.note_held(ADDR, (1, 50))
    assert NodeIdentity.open(str(tmp_path), "s", "c-1").held(ADDR) == (1, 10)  # not yet written
    me.flush()
    assert NodeIdentity.open(str(tmp_path), "s", "c-1").held(ADDR) == (1, 50)


@pytest.mark.parametrize("message", [{}, {"cluster": "c", "node": "n", "run": "r", "gen": 0},
                                     {"cluster": "c", "node": "n", "run": "r", "gen": True},
                                     {"cluster": 1, "node": "n", "run": "r", "gen": 1},
                                     {"cluster": "c", "node": "", "run": "r", "gen": 1},
                                     {"cluster": "c", "node": "n", "run": "r", "gen": 1, "log": [1]},
                                     {"cluster": "c", "node": "n", "run": "r", "gen": 1, "log": [1, -1]},
                                     {"cluster": "c", "node": "n", "run": "r", "gen": 1, "proto": "2"}])
def test_malformed_hello(message):
    with pytest.raises(ValueError):
        Hello.from_message(message)
