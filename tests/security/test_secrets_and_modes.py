"""Secrets never on a command line, private files, and a local cluster that says what it is for.

* a password option (pidctl's ``--sasl-password``, the broker's ``--quorum-sasl-password``) is refused with
  one line naming the ways that are allowed (exit 2); a password comes from a file or the environment,
  and a process the suite starts has none in its ``/proc/PID/cmdline``;
* what ``pidctl cluster up`` and a broker write (configs, cluster.json, logs, data, ready files) is for
  their own user only (no group or world bits);
* ``pidctl cluster up`` says its cluster takes unauthenticated requests and is for development.
"""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest
from click.testing import CliRunner

from benchmarks.processes import REPO, BrokerProcess, child_env
from cli.main import cli
from quorum.settings.flags import read_secret_file
from tests.cli.conftest import pidctl  # noqa: F401 - the fixture: a local cluster driven through pidctl
from tests.security.conftest import BROKER_ACL, PASSWORDS

REFUSED = ("is refused: a secret on the command line is visible to every local user (ps, /proc/PID/cmdline); "
           "use ")


def _cmdline(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read()


def _not_private(root: str) -> list[str]:
    """Every path under ``root`` (and ``root``) that its group or others may read, write or enter."""
    out = []
    for path in [root] + [os.path.join(d, n) for d, dirs, files in os.walk(root) for n in dirs + files]:
        mode = os.lstat(path).st_mode
        if not stat.S_ISLNK(mode) and mode & 0o077:
            out.append(f"{os.path.relpath(path, root)} {stat.S_IMODE(mode):04o}")
    return out


def _run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=REPO, timeout=60,
                          env=child_env({**os.environ, **(env or {})}))


# ------------------------------------------------------------------------------------------ refused
@pytest.mark.parametrize("argv,option,ways", [
    (["-m", "cli.main", "--sasl-password", "hunter2-secret", "--quorum", "127.0.0.1:1", "quorum", "status"],
     "--sasl-password", "--sasl-password-file PATH or the environment variable PIDQUORUM_SASL_PASSWORD"),
    (["-m", "cli.main", "--sasl-password=hunter2-secret", "cluster", "new-id"],
     "--sasl-password", "--sasl-password-file PATH or the environment variable PIDQUORUM_SASL_PASSWORD"),
    (["-m", "broker", "--broker-id", "1", "--quorum", "127.0.0.1:1", "--quorum-security-protocol", "SASL_PLAINTEXT",
      "--quorum-sasl-username", "broker", "--quorum-sasl-password", "hunter2-secret"],
     "--quorum-sasl-password", "--quorum-sasl-password-file PATH, the environment variable "
                               "PIDQUORUM_BROKER_SASL_PASSWORD or quorum_security.sasl_password in the --config file"),
])
def test_a_password_flag_is_refused_with_one_line_saying_what_to_use(argv, option, ways):
    res = _run(*argv)
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    errors = [line for line in res.stderr.splitlines() if line.startswith("Error:")]
    assert errors == [f"Error: {option} {REFUSED}{ways}"], res.stderr
    assert "hunter2-secret" not in res.stdout + res.stderr and "Traceback" not in res.stderr


def test_a_password_file_one_newline_stripped_and_a_warning_if_others_may_read_it(tmp_path, monkeypatch):
    path = tmp_path / "pw"
    path.write_text("p w\n\n")
    path.chmod(0o600)
    warnings: list[str] = []
    assert read_secret_file(str(path), warnings.append) == "p w\n" and warnings == []  # one newline only
    path.write_text("pw\r\n")
    path.chmod(0o640)
    assert read_secret_file(str(path), warnings.append) == "pw"
    assert warnings == [f"warning: {path} holds a secret but has mode 0640: group or others may read it "
                        f"(chmod 600 {path})"]
    # through pidctl: the warning on stderr, the command runs; an unreadable or empty file is a usage error
    res = CliRunner().invoke(cli, ["--security-protocol", "SASL_PLAINTEXT", "--sasl-username", "a",
                                   "--sasl-password-file", str(path), "cluster", "new-id"])
    assert res.exit_code == 0 and "group or others may read it" in res.stderr and "pw" not in res.stdout
    for bad, why in ((tmp_path / "missing", "No such file or directory"), (tmp_path / "empty", "is empty")):
        if bad.name == "empty":
            bad.write_text("\n")
            bad.chmod(0o600)
        res = CliRunner().invoke(cli, ["--sasl-password-file", str(bad), "cluster", "new-id"])
        assert res.exit_code == 2 and f"cannot read {bad}" in res.output and why in res.output, res.output


# ------------------------------------------------------------------------------- real processes
def test_no_password_in_the_command_line_of_a_process_the_suite_starts(secure_quorum, tmp_path):
    """A broker that reached the SASL_SSL quorum with its password (from a file, and from the environment)
    has none on its command line; neither have the nodes (the cluster secret comes from a file)."""
    sq = secure_quorum
    sq.grant([BROKER_ACL])
    common = ["--quorum-security-protocol", "SASL_SSL", "--quorum-sasl-username", "broker",
              "--quorum-tls-cafile", sq.pki.cafile]
    brokers = [BrokerProcess(str(tmp_path), 21, sq.addresses, *common,
                             "--quorum-sasl-password-file", sq.password_file("broker")),
               BrokerProcess(str(tmp_path), 22, sq.addresses, *common,
                             env={"PIDQUORUM_BROKER_SASL_PASSWORD": PASSWORDS["broker"]})]
    with open(os.path.join(sq.lc.dir, "secret"), "rb") as f:
        cluster_secret = f.read().strip()
    try:
        for b in brokers:
            b.start(timeout=30)  # serving: it registered with the quorum, so it had the password
        cmdlines = {f"broker {b.broker_id}": _cmdline(b.proc.pid) for b in brokers}
        cmdlines.update({f"node {n.node_id}": _cmdline(n.pid) for n in sq.lc.nodes()})
        for what, cmdline in cmdlines.items():
            assert cmdline, what
            for secret in [p.encode() for p in PASSWORDS.values()] + [cluster_secret]:
                assert secret not in cmdline, (what, cmdline)
        assert b"--quorum-sasl-password-file" in cmdlines["broker 21"]
        for b in brokers:
            assert _not_private(b.dir) == [], b.broker_id  # data, snapshots, ready file, log
    finally:
        for b in brokers:
            b.stop()


def test_the_local_cluster_is_private_and_says_it_is_for_development(pidctl):  # noqa: F811
    out = pidctl("cluster", "up").output
    assert ("note: this cluster is for development on one machine only: its client ports accept unauthenticated "
            "requests (ACL, quota and broker changes) from anyone on 127.0.0.1; to deploy, see "
            "docs/deployment.md") in out
    epoch = json.loads(pidctl("broker", "register", "--broker-id", "1", "-o", "json").output)["broker_epoch"]
    pidctl("allocate", "--broker-id", "1", "--broker-epoch", str(epoch), "--count", "2")
    pidctl("snapshot", "take")
    root = pidctl.data_dir
    names = set(os.listdir(root))
    assert {"cluster.json", "secret", "node-1.toml", "node-1.log", "node-1.ready", "node-1"} <= names, names
    assert os.listdir(os.path.join(root, "node-1"))  # the node wrote its data
    assert _not_private(root) == []
    pidctl("cluster", "down")
    assert _not_private(root) == []
