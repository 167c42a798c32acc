"""A broker's settings (broker.config): its file, flags over the file, its errors; no processes."""
from __future__ import annotations

import dataclasses
import os

import pytest
from click.testing import CliRunner

import cli.broker
from quorum import settings
from broker.config import BrokerConfig, QuorumSecurity
from broker.config import load as load_broker
from broker.pid_manager import PidManagerConfig
from cli.broker import broker_start
from cli.common import Ctx
from quorum.security.client import ClientSecurity
from quorum.settings import ConfigError
from tests.support.config_files import refusal


def test_a_password_is_not_repeated_in_a_message():
    with pytest.raises(ConfigError) as e:
        settings.build(QuorumSecurity, {"sasl_password": 12345})
    assert "sasl_password" in str(e.value) and "12345" not in str(e.value)


def test_every_broker_setting_has_a_flag_and_the_old_flags_keep_their_meaning():
    names = {p.name for p in broker_start.params}
    fields = {f.name for f in dataclasses.fields(BrokerConfig)} - {"pid_manager", "quorum_security"}
    assert fields | {f"pid_manager__{f.name}" for f in dataclasses.fields(PidManagerConfig)} <= names
    opts = {o for p in broker_start.params for o in (*p.opts, *p.secondary_opts)}
    assert {"--broker-id", "--quorum", "--listen", "--advertised", "--data-dir", "--partitions", "--no-dedup",
            "--producer-id-expiration-ms", "--producer-id-quota-window-num", "--producer-id-quota-window-size-s",
            "--quota-refresh-s", "--ready-file", "--log-level", "--log-format", "--metrics-port", "--metrics-host",
            "--sasl-credentials-file", "--sasl-mechanism", "--super-user", "--acl-refresh-ms", "--tls-certfile",
            "--tls-keyfile", "--tls-cafile", "--tls-client-auth", "--quorum-security-protocol",
            "--quorum-sasl-mechanism", "--quorum-sasl-username", "--quorum-sasl-password-file",
            "--quorum-tls-cafile", "--config", "--max-connections", "--max-connections-per-ip",
            "--max-connection-buffer-bytes", "--describe-producers-limit"} <= opts


def _start(monkeypatch, args, env=None):
    """``pidctl broker start --broker-id 1 --quorum h:1 ARGS``: the settings its flags and environment gave
    (nothing runs: the config is not loaded)."""
    seen = {}

    def load(path, flags, quorum=None):
        seen.update(flags)
        raise SystemExit(0)
    monkeypatch.setattr(cli.broker, "load_broker_config", load)
    result = CliRunner().invoke(cli.broker.broker_start, ["--broker-id", "1", "--quorum", "h:1", *args], env=env,
                                obj=Ctx(".", None, 1.0))
    return result, seen


def test_the_quorum_password_is_refused_as_a_flag_and_read_from_a_file_or_the_environment(tmp_path, monkeypatch):
    result, seen = _start(monkeypatch, ["--quorum-sasl-password", "pw"])
    assert result.exit_code == 2 and seen == {}
    assert ("--quorum-sasl-password is refused: a secret on the command line is visible to every local user "
            "(ps, /proc/PID/cmdline); use --quorum-sasl-password-file PATH, the environment variable "
            "PIDQUORUM_BROKER_SASL_PASSWORD or quorum_security.sasl_password in the --config file") in result.output
    secret = tmp_path / "pw"
    secret.write_text("from-file\n")
    secret.chmod(0o600)
    result, seen = _start(monkeypatch, ["--quorum-sasl-password-file", str(secret)],
                          env={"PIDQUORUM_BROKER_SASL_PASSWORD": "from-env"})
    assert result.exit_code == 0, result.output
    assert seen["quorum_security"] == {"sasl_password": "from-file"}  # the file given wins over the environment
    result, seen = _start(monkeypatch, [], env={"PIDQUORUM_BROKER_SASL_PASSWORD": "from-env"})
    assert result.exit_code == 0 and seen["quorum_security"] == {"sasl_password": "from-env"}
    assert "from-env" not in result.output and "from-file" not in result.output


def _every_broker_setting(tmp_path) -> BrokerConfig:
    cfg = BrokerConfig(
        broker_id=9, quorum=["10.0.0.1:9092", "10.0.0.2:9092"], listen="0.0.0.0:19092", data_dir=str(tmp_path / "d"),
        advertised="10.0.1.9:19092", cluster_id="c-test", default_partitions=3, auto_create_topics=False,
        max_frame_bytes=65536, max_connections=50, max_connections_per_ip=5, max_connection_buffer_bytes=131072,
        max_unauthenticated_frame_bytes=4096, authentication_timeout_ms=2500, tls_handshake_timeout_ms=1500,
        broker_heartbeat_interval_ms=500,
        describe_producers_limit=10, producer_id_expiration_ms=1000, max_producers_per_partition=500,
        idempotence_retry_window_ms=60_000, producer_snapshot_every=77, segment_bytes=4096, retention_ms=-1, retention_bytes=1 << 30,
        max_open_segments=64, max_topics=10, dedup=False, io_threads=2,
        group_min_session_timeout_ms=1000, group_max_session_timeout_ms=60_000, group_initial_rebalance_delay_ms=0,
        group_max_size=50, max_groups=500, offset_metadata_max_bytes=100, offsets_retention_minutes=60,
        quorum_timeout_s=2.5, metrics_port=19096, metrics_host="0.0.0.0", log_format="json",
        pid_manager=PidManagerConfig(prefetch_threshold=0.5, adaptive=False, failover_budget_s=1.0,
                                     learn_failover_budget=False, outage_margin=2.0, outage_memory_s=60.0,
                                     max_prefetch_blocks=8, backoff_initial_s=0.1, backoff_max_s=2.0,
                                     backoff_jitter=0.1, start_timeout_s=10.0, rate_window_s=0.5,
                                     rate_ewma_alpha=0.5, rate_peak_windows=10, latency_ewma_alpha=0.5),
        producer_id_quota_window_num=5, producer_id_quota_window_size_s=60.0,
        producer_id_quota_false_positive_rate=0.01, producer_id_quota_burst_s=30.0, quota_refresh_s=2.0,
        sasl_credentials_file=str(tmp_path / "users.json"), sasl_mechanisms=("PLAIN",), super_users=("User:admin",),
        acl_refresh_s=0.5, tls_certfile=str(tmp_path / "b.pem"), tls_keyfile=str(tmp_path / "b.key"),
        tls_cafile=str(tmp_path / "ca.pem"), tls_client_auth=True,
        quorum_security=ClientSecurity("SASL_SSL", "SCRAM-SHA-256", "broker", "pw", str(tmp_path / "qca.pem")))
    defaults = BrokerConfig(broker_id=0, quorum=["h:1"])
    for obj, default in ((cfg, defaults), (cfg.pid_manager, PidManagerConfig())):
        for f in dataclasses.fields(obj):
            assert getattr(obj, f.name) != getattr(default, f.name), f"set {f.name} to a non-default value"
    return cfg


def test_a_broker_file_gives_every_setting(tmp_path):
    cfg = _every_broker_setting(tmp_path)
    text = settings.to_toml(cfg, exclude=("quorum_security",))
    text += ('[quorum_security]\nsecurity_protocol = "SASL_SSL"\nsasl_mechanism = "SCRAM-SHA-256"\n'
             'sasl_username = "broker"\nsasl_password = "pw"\ntls_cafile = "qca.pem"\n')
    path = tmp_path / "broker.toml"
    path.write_text(text)
    assert load_broker(str(path)) == cfg


def test_flags_override_the_file_and_defaults_fill_the_rest(tmp_path):
    path = tmp_path / "broker.toml"
    path.write_text('broker_id = 1\nquorum = ["h:1"]\ndata_dir = "data"\ndefault_partitions = 3\n'
                    'sasl_credentials_file = "users.json"\n[pid_manager]\nadaptive = false\nmax_prefetch_blocks = 4\n')
    cfg = load_broker(str(path), {"default_partitions": 2, "pid_manager": {"max_prefetch_blocks": 1},
                                  "sasl_credentials_file": "here.json"}, quorum=lambda: pytest.fail("not asked"))
    assert (cfg.broker_id, cfg.default_partitions, cfg.data_dir) == (1, 2, str(tmp_path / "data"))
    assert cfg.sasl_credentials_file == "here.json"  # a flag's path is the command line's, not the file's
    assert cfg.pid_manager == PidManagerConfig(adaptive=False, max_prefetch_blocks=1)
    assert cfg.listen == "127.0.0.1:9092" and cfg.quorum_security is None


def test_the_broker_defaults_without_a_file():
    cfg = load_broker(None, {"broker_id": 4}, quorum=lambda: ["h:1", "h:2"])
    assert cfg.quorum == ["h:1", "h:2"] and cfg.data_dir == ".pidquorum-broker-4" and cfg.dedup
    assert cfg == BrokerConfig(broker_id=4, quorum=["h:1", "h:2"])


@pytest.mark.parametrize("text,message", [
    ("bogus = 1\n", "bogus: unknown key"),
    ("[pid_manager]\nbogus = 1\n", "pid_manager.bogus: unknown key"),
    ("[pid_manager]\nprefetch_threshold = 1.0\n", "pid_manager.prefetch_threshold: should be less than 1"),
    ("[pid_manager]\nbackoff_initial_s = 9.0\n", "pid_manager: need 0 < backoff_initial_s <= backoff_max_s"),
    ('default_partitions = "3"\n', "default_partitions: should be a valid integer, got '3'"),
    ("metrics_port = 70000\n", "metrics_port: should be less than or equal to 65535"),
    ('tls_keyfile = "k.pem"\n', "tls_keyfile / tls_cafile / tls_client_auth need tls_certfile"),
    ('super_users = ["admin"]\n', "super_users[0]: 'admin' is not User:<name>"),
    ('sasl_mechanisms = ["MD5"]\n', "sasl_mechanisms[0]: should be 'PLAIN' or 'SCRAM-SHA-256'"),
    ('[quorum_security]\nsecurity_protocol = "SASL_SSL"\n', "quorum_security: SASL_SSL needs a SASL user name"),
    ('[quorum_security]\nprotocol = "SSL"\n', "quorum_security.protocol: unknown key"),
    ("quorum_security = 1\n", "quorum_security: expected a table, got 1"),
])
def test_a_bad_broker_file_is_refused_naming_the_key(tmp_path, text, message):
    refused = refusal(tmp_path / "broker.toml", 'broker_id = 1\nquorum = ["h:1"]\n' + text, load_broker)
    assert message in refused, refused


def test_the_kafka_preset_and_checks_of_pid_manager_config():
    assert PidManagerConfig.kafka_fixed_threshold(max_prefetch_blocks=2).max_prefetch_blocks == 2
    with pytest.raises(ValueError, match="backoff_initial_s"):
        PidManagerConfig(backoff_initial_s=1.0, backoff_max_s=0.5)
    with pytest.raises(ValueError, match="unexpected_keyword_argument|Unexpected keyword"):
        PidManagerConfig(no_such_setting=1)


def test_the_shipped_broker_file_loads():
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "deploy",
                        "broker.toml")
    cfg = load_broker(path)
    assert (cfg.broker_id, cfg.default_partitions, cfg.quorum_security) == (1, 3, None)
    assert cfg.data_dir == "/var/lib/pidquorum-broker" and cfg.pid_manager == PidManagerConfig()
