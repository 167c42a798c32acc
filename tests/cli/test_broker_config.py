"""``pidctl broker start --config FILE`` refusing a bad file or bad flags before it starts anything
(no quorum: every case fails before the broker would reach one)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from cli.common import EXIT_ERROR, EXIT_USAGE
from cli.main import cli

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOOD = 'broker_id = 1\nquorum = ["127.0.0.1:1"]\n'


def start(tmp_path, *args: str):
    return CliRunner().invoke(cli, ["--data-dir", str(tmp_path / "no-cluster"), "broker", "start", *args])


@pytest.mark.parametrize("text,message", [
    (GOOD + "partitions = 3\n", "partitions: unknown key"),  # the flag's name, not the setting's
    (GOOD + "[pid_manager]\nprefetch = 0.5\n", "pid_manager.prefetch: unknown key"),
    (GOOD + 'metrics_port = "9096"\n', "metrics_port: should be a valid integer, got '9096'"),
    (GOOD + "default_partitions = 0\n", "default_partitions: should be greater than or equal to 1, got 0"),
    (GOOD + "[pid_manager]\nbackoff_jitter = 1.5\n", "pid_manager.backoff_jitter: should be less than 1"),
    (GOOD + "tls_client_auth = true\n", "tls_keyfile / tls_cafile / tls_client_auth need tls_certfile"),
    ('broker_id = 1\nquorum = ["10.0.0.1"]\n', "quorum[0]: expected host:port, got '10.0.0.1'"),
    ("quorum = [\"127.0.0.1:1\"]\n", "broker_id: missing (required)"),
    (GOOD + "[pid_manager\n", "invalid TOML"),
])
def test_a_bad_file_is_one_line_naming_the_file_and_the_key(tmp_path, text, message):
    path = tmp_path / "broker.toml"
    path.write_text(text)
    r = start(tmp_path, "--config", str(path))
    assert r.exit_code == EXIT_ERROR, r.output
    assert r.output.count("\n") == 1 and r.output.startswith(f"error: {path}: "), r.output
    assert message in r.output, r.output


def test_an_unreadable_file_is_named(tmp_path):
    r = start(tmp_path, "--config", str(tmp_path / "missing.toml"))
    assert r.exit_code == EXIT_ERROR and r.output == f"error: {tmp_path / 'missing.toml'}: No such file or directory\n"


def test_a_bad_flag_over_a_good_file_names_the_setting(tmp_path):
    path = tmp_path / "broker.toml"
    path.write_text(GOOD)
    r = start(tmp_path, "--config", str(path), "--quorum", "nowhere")
    assert r.exit_code == EXIT_ERROR and "quorum[0]: expected host:port, got 'nowhere'" in r.output, r.output
    r = start(tmp_path, "--config", str(path), "--partitions", "0")  # the flag's own range: a usage error
    assert r.exit_code == EXIT_USAGE and "Invalid value for '--partitions'" in r.output, r.output


def test_without_a_file_bad_flags_are_usage_errors_as_before(tmp_path):
    r = start(tmp_path, "--quorum", "127.0.0.1:1")
    assert r.exit_code == EXIT_USAGE and "Missing option '--broker-id'" in r.output, r.output
    r = start(tmp_path, "--broker-id", "1", "--quorum", "127.0.0.1:1", "--tls-keyfile", "k.pem")
    assert r.exit_code == EXIT_USAGE and "need tls_certfile" in r.output, r.output
    r = start(tmp_path, "--broker-id", "1", "--quorum", "127.0.0.1:1", "--acl-refresh-ms", "5")
    assert r.exit_code == EXIT_USAGE and "'--acl-refresh-ms'" in r.output, r.output


def test_python_m_broker_refuses_a_bad_file_the_same_way(tmp_path):
    path = tmp_path / "broker.toml"
    path.write_text(GOOD + "[pid_manager]\nmax_prefetch_blocks = 0\n")
    r = subprocess.run([sys.executable, "-m", "broker", "--config", str(path)], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == EXIT_ERROR, r.stderr
    assert r.stderr.strip().splitlines() == [f"error: {path}: pid_manager.max_prefetch_blocks: should be greater "
                                             "than or equal to 1, got 0"]
