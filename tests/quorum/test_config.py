"""Unit tests for quorum.config (files in tmp_path; no Raft, no network)."""
from __future__ import annotations

import dataclasses
import logging
import os

import pytest

from quorum.config import ConfigError, NodeConfig, Peer, from_dict, load, to_toml
from quorum.raft import RaftConfig


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def test_to_toml_round_trips_every_field(tmp_path):
    cfg = NodeConfig(
        node_id=7, data_dir=str(tmp_path / "data"), raft_address="10.0.0.7:19093",
        client_address="10.0.0.7:19092", secret="s3cret",
        peers=[Peer(8, "10.0.0.8:19093", "10.0.0.8:19092"), Peer(9, "10.0.0.9:19093", "10.0.0.9:19092")],
        raft_bind="0.0.0.0:19093", client_bind="0.0.0.0:19092", block_size=4096, request_timeout_ms=1500,
        allocate_rate_per_broker=12.5, allocate_burst=40, max_frame_bytes=65536, max_batch=64,
        transactional_id_expiration_ms=3600000, transaction_max_timeout_ms=60000, cluster_id="c-test",
        metrics_port=19095, metrics_host="0.0.0.0", log_format="json",
        sasl_credentials_file=str(tmp_path / "users.json"), sasl_mechanisms=["PLAIN"], super_users=["User:admin"],
        tls_certfile=str(tmp_path / "n.pem"), tls_keyfile=str(tmp_path / "n.key"), tls_cafile=str(tmp_path / "ca.pem"),
        tls_client_auth=True,
        allocate_reserve_blocks=16,
        max_connections=50, max_connections_per_ip=5, max_connection_buffer_bytes=131072,
        max_unauthenticated_frame_bytes=8192, authentication_timeout_ms=2500, tls_handshake_timeout_ms=1500,
        broker_session_timeout_ms=4500,
        raft=RaftConfig(heartbeat_interval=0.02, election_timeout_min=0.1, election_timeout_max=0.3,
                        connection_timeout=0.6, reconnect_interval=0.05, peer_ping_interval=0.2,
                        leader_step_down_timeout=0.7, compaction_min_entries=100, compaction_min_time=60.0,
                        snapshot_chunk_bytes=4096, append_entries_batch_bytes=8192, max_message_bytes=2**21,
                        handshake_bytes=2048,
                        handshake_timeout=3.0, max_pending_connections=32, max_pending_per_host=4,
                        listen_backlog=256, accept_rate=50.0, accept_burst=16),
    )
    # Every field that has a default is set to something else, so a dropped field cannot hide.
    for obj in (cfg, cfg.raft):
        for f in dataclasses.fields(obj):
            assert getattr(obj, f.name) != _default(f), f"set {type(obj).__name__}.{f.name} to a non-default value"
    (tmp_path / "secret").write_text("s3cret\n")
    path = tmp_path / "node.toml"
    path.write_text(to_toml(cfg, "secret"))
    assert load(str(path)) == cfg


def test_to_toml_leaves_out_unset_binds(tmp_path):
    cfg = NodeConfig(node_id=1, data_dir=str(tmp_path / "data"), raft_address="127.0.0.1:9093",
                     client_address="127.0.0.1:9092", secret="s")
    text = to_toml(cfg, "secret")
    assert "raft_bind" not in text and "client_bind" not in text
    (tmp_path / "secret").write_text("s\n")
    path = tmp_path / "node.toml"
    path.write_text(text)
    loaded = load(str(path))
    assert loaded == cfg and loaded.raft_bind is None and loaded.client_bind is None


def test_metrics_port_and_log_format_are_checked(tmp_path):
    base = {"node_id": 1, "data_dir": "d", "raft_address": "127.0.0.1:1", "client_address": "127.0.0.1:2",
            "secret": "s"}
    assert from_dict(base, str(tmp_path)).metrics_port == 0  # absent = off
    assert from_dict({**base, "metrics_port": 9095, "log_format": "json"}, str(tmp_path)).metrics_port == 9095
    for bad, message in [({"metrics_port": 70000}, "metrics_port"), ({"metrics_port": "9095"}, "metrics_port"),
                         ({"metrics_port": True}, "metrics_port"), ({"log_format": "xml"}, "log_format"),
                         ({"raft": {"snapshot_chunk_bytes": 0}}, "snapshot_chunk_bytes")]:
        with pytest.raises(ConfigError, match=message):
            from_dict({**base, **bad}, str(tmp_path))


def test_a_secret_file_that_group_or_others_may_read_is_warned_about(tmp_path, caplog):
    base = {"node_id": 1, "data_dir": "d", "raft_address": "127.0.0.1:1", "client_address": "127.0.0.1:2",
            "secret_file": "secret"}
    secret = tmp_path / "secret"
    secret.write_text("s3cret\n")
    os.chmod(secret, 0o600)
    with caplog.at_level(logging.WARNING, logger="quorum.config"):
        assert from_dict(base, str(tmp_path)).secret == "s3cret"
    assert not caplog.records
    os.chmod(secret, 0o644)
    with caplog.at_level(logging.WARNING, logger="quorum.config"):
        assert from_dict(base, str(tmp_path)).secret == "s3cret"  # still used: a warning, not a refusal
    assert "mode 0644" in caplog.text and "chmod 600" in caplog.text
