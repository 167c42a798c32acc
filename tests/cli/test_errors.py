"""Every error is one line with a documented exit code (docs/cli.md): bad values, a port taken, no cluster."""
from __future__ import annotations

import json
import os
import pty
import signal
import socket
import subprocess
import sys
from importlib.metadata import version

import pytest
from click.testing import CliRunner

from cli.common import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_REFUSED, EXIT_UNAVAILABLE, EXIT_USAGE
from cli.main import cli
from quorum.localcluster import LocalCluster, free_ports
from tests.conftest import wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PIDCTL = [sys.executable, "-m", "cli.main"]  # what the pidctl script runs


def pidctl_process(*args, timeout: float = 60, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*PIDCTL, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def one_line(text: str) -> str:
    """The one line of an error (and no traceback)."""
    lines = [x for x in text.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


def listening(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, int(port)))
    s.listen(1)
    return s


@pytest.fixture
def invoke(tmp_path):
    runner = CliRunner()

    def go(*args, expect: int | None = 0, env: dict | None = None):
        result = runner.invoke(cli, ["--data-dir", str(tmp_path / "pq"), *args], env=env)
        assert expect is None or result.exit_code == expect, (result.exit_code, result.output, result.exception)
        return result
    return go


# ------------------------------------------------------------------ bad values: usage errors (2)
@pytest.mark.parametrize("args, named", [
    (["--quorum", "foo", "blocks", "latest"], "'foo' is not host:port"),
    (["--quorum", "127.0.0.1:99999", "quorum", "status"], "'127.0.0.1:99999' is not host:port"),
    (["--timeout", "0", "blocks", "latest"], "'0' is not a number of seconds above 0"),
    (["--timeout", "-1", "blocks", "latest"], "'-1' is not a number of seconds above 0"),
    (["blocks", "latest", "--timeout", "0"], "'0' is not a number of seconds above 0"),
    (["broker", "register", "--broker-id", "99999999999"], "0<=x<=2147483647"),
    (["broker", "register", "--broker-id", "-1"], "0<=x<=2147483647"),
    (["broker", "register", "--broker-id", "1", "--listener", "foo"], "'foo' is not host:port"),
    (["allocate", "--broker-id", "1", "--broker-epoch", "99999999999999999999"], "0<=x<=9223372036854775807"),
    (["allocate", "--broker-id", "1", "--broker-epoch", "1", "--count", "0"], "1<=x<=1000000"),
    (["broker", "status", "--metrics", "nohost"], "'nohost' is not host:port"),
    (["quorum", "remove-node", "foo"], "'foo' is not host:port"),
    (["node", "start", "--config", "/nonexistent/node.toml"], "does not exist"),
])
def test_bad_values_are_usage_errors_naming_the_value(invoke, args, named):
    assert named in invoke(*args, expect=EXIT_USAGE).output


def test_paths_that_are_not_what_they_should_be(invoke, tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory\n")
    r = invoke("--data-dir", str(a_file), "cluster", "up", expect=EXIT_USAGE)
    assert f"Directory '{a_file}' is a file" in r.output
    r = invoke("cluster", "up", "--data-dir", str(a_file / "below"), expect=EXIT_ERROR)  # was a traceback
    assert one_line(r.output) == f"error: {a_file / 'below'}: Not a directory"
    r = invoke("--security-protocol", "SSL", "--tls-cafile", str(a_file), "blocks", "latest", expect=EXIT_USAGE)
    assert f"cannot load the TLS CA file ({a_file})" in r.output  # was "no node answered" (3)
    r = invoke("--security-protocol", "SSL", "--tls-cafile", str(tmp_path / "missing.pem"), "blocks", "latest",
               expect=EXIT_USAGE)
    assert "does not exist" in r.output


def test_a_usage_error_of_the_pidctl_command_is_one_line():
    """Was a kio TypeError traceback (exit 1): an int32 broker id out of range."""
    r = pidctl_process("broker", "register", "--broker-id", "99999999999")
    assert r.returncode == EXIT_USAGE, r
    line = one_line(r.stderr)
    assert line.startswith("Error: ") and "--broker-id" in line and "2147483647" in line
    assert r.stdout == ""


def test_version(invoke):
    assert invoke("--version").output.strip() == f"pidctl {version('pidquorum')}"


# ------------------------------------------------------------------ global options after the command
def test_global_options_are_taken_after_the_command_too(invoke, tmp_path):
    closed, before, env = (f"127.0.0.1:{p}" for p in free_ports(3))  # nothing listens there

    def asked(r) -> set[str]:  # the addresses quorum status reports on
        return {n["client_address"] for n in json.loads(r.stdout)}

    # Was "No such option '--quorum'" (2): now it asks that address, and nothing answers (3).
    r = invoke("quorum", "status", "--quorum", closed, "--timeout", "1", "-o", "json", expect=EXIT_UNAVAILABLE)
    assert asked(r) == {closed}
    # After the command, given values win over the environment's and over those before the command.
    r = invoke("--quorum", before, "quorum", "status", "--quorum", closed, "--timeout", "1", "-o", "json",
               env={"PIDQUORUM_QUORUM": env}, expect=EXIT_UNAVAILABLE)
    assert asked(r) == {closed}
    # The environment still applies when no option is given, and an option before the command wins over it.
    r = invoke("quorum", "status", "--timeout", "1", "-o", "json", env={"PIDQUORUM_QUORUM": env},
               expect=EXIT_UNAVAILABLE)
    assert asked(r) == {env}
    r = invoke("--quorum", before, "quorum", "status", "--timeout", "1", "-o", "json", env={"PIDQUORUM_QUORUM": env},
               expect=EXIT_UNAVAILABLE)
    assert asked(r) == {before}
    other = tmp_path / "other"
    r = invoke("blocks", "latest", "--data-dir", str(other), expect=EXIT_ERROR)
    assert f"no cluster in {other}" in r.output
    # Security options too: a bad combination is refused as before the command.
    r = invoke("blocks", "latest", "--security-protocol", "SASL_PLAINTEXT", expect=EXIT_USAGE)
    assert "SASL" in r.output
    assert "refused" in invoke("blocks", "latest", "--sasl-password", "x", expect=EXIT_USAGE).output


def test_broker_start_keeps_its_own_data_dir_and_quorum(invoke):
    """broker start has --data-dir and --quorum of its own (the broker's): they are not pidctl's there."""
    out = invoke("broker", "start", "--help").output
    assert "--data-dir" in out and "--quorum" in out


# ------------------------------------------------------------------ a broker's metrics endpoint
def test_broker_status_of_an_address_without_metrics_says_how_to_serve_them(invoke):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    address = f"127.0.0.1:{s.getsockname()[1]}"
    s.close()
    r = invoke("broker", "status", "--metrics", address, "--timeout", "2", expect=EXIT_UNAVAILABLE)
    assert address in r.output and "--metrics-port" in r.output


# ------------------------------------------------------------------ a port taken: one line, exit 69 / 71
@pytest.fixture
def one_node(tmp_path):
    lc = LocalCluster(str(tmp_path / "pq"))
    lc.create(size=1, metrics=True)
    return lc


@pytest.mark.parametrize("port", ["Raft", "client", "metrics"])
def test_a_node_whose_port_is_taken_stops_with_one_line_naming_it(one_node, port):
    """Was a 21-line pysyncobj traceback for the Raft port, a tuple for the client port."""
    (info,) = one_node.nodes()
    address = {"Raft": info.raft_address, "client": info.client_address, "metrics": info.metrics_address}[port]
    with listening(address):
        r = pidctl_process("node", "start", "--config", one_node.config_path(1))
    assert r.returncode == 69, r
    critical = [x for x in r.stderr.splitlines() if "CRITICAL" in x]
    assert "Traceback" not in r.stderr and len(critical) == 1, r.stderr
    assert f"cannot bind the {port} port {address}: Address already in use" in critical[0]


def test_a_broker_whose_port_is_taken_stops_with_one_line_naming_it(tmp_path):
    with listening("127.0.0.1:0") as s:
        address = f"127.0.0.1:{s.getsockname()[1]}"
        r = pidctl_process("broker", "start", "--broker-id", "1", "--listen", address, "--data-dir",
                           str(tmp_path / "b"), "--quorum", "127.0.0.1:1")
    assert r.returncode == 71, r
    assert "Traceback" not in r.stderr
    assert f"cannot bind the Kafka port {address}: Address already in use" in r.stderr


# ------------------------------------------------------------------ against a cluster
@pytest.fixture
def cluster(tmp_path):
    data_dir = str(tmp_path / "pq")
    lc = LocalCluster(data_dir)
    lc.up(size=3)
    yield data_dir
    lc.down(timeout=5)


def test_stale_broker_epoch_names_the_current_epoch(cluster):
    runner = CliRunner()

    def invoke(*args):
        return runner.invoke(cli, ["--data-dir", cluster, "--timeout", "15", *args])

    first = int(invoke("broker", "register", "--broker-id", "1").output)
    epoch = int(invoke("broker", "register", "--broker-id", "1").output)  # registered again: a new epoch
    assert epoch > first
    r = invoke("allocate", "--broker-id", "1", "--broker-epoch", str(first))
    assert r.exit_code == EXIT_REFUSED, r.output
    assert one_line(r.output) == (f"error: STALE_BROKER_EPOCH: broker 1's current epoch is {epoch} (given {first}): "
                                  f"pass --broker-epoch {epoch}, or register it again")
    r = invoke("allocate", "--broker-id", "77", "--broker-epoch", "3")
    assert r.exit_code == EXIT_REFUSED, r.output
    assert "broker 77 is not registered" in one_line(r.output)
    assert invoke("allocate", "--broker-id", "1", "--broker-epoch", str(epoch)).exit_code == 0


@pytest.mark.parametrize("output", ["table", "json"])
def test_an_interrupted_allocation_reports_what_it_allocated(cluster, output):
    runner = CliRunner()
    epoch = int(runner.invoke(cli, ["--data-dir", cluster, "broker", "register", "--broker-id", "1"]).output)
    proc = subprocess.Popen([*PIDCTL, "--data-dir", cluster, "allocate", "--broker-id", "1", "--broker-epoch",
                             str(epoch), "--count", "1000000", "-o", output], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            # A child inherits an ignored SIGINT (a test worker may ignore it): Ctrl-C as a shell's.
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        def allocated():
            r = runner.invoke(cli, ["--data-dir", cluster, "blocks", "latest", "-o", "json"])
            latest = json.loads(r.stdout) if r.exit_code == 0 else {}
            return (latest.get("latest_block") or {}).get("broker_id") == 1 and latest["next_producer_id"] >= 5000
        wait_for(allocated, 30, what="a few blocks allocated")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=90)  # (a loaded 2-core CI machine took over 30 s to wind down)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == EXIT_INTERRUPTED, (out, err)
    line = one_line(err)
    assert line.startswith("warning: interrupted: ") and "of 1000000 blocks allocated for broker 1" in line
    count = int(line.split("interrupted: ")[1].split(" ")[0])
    assert count >= 4 and "producer IDs " in line
    if output == "json":
        blocks = json.loads(out)
        assert len(blocks) == count
        first, last = blocks[0]["producer_id_start"], blocks[-1]["next_producer_id"] - 1
        assert f"producer IDs {first}..{last} (1 range)" in line  # one broker alone: adjacent blocks
    else:
        assert out == ""


def test_allocate_shows_progress_only_when_stderr_is_a_terminal(cluster):
    runner = CliRunner()
    epoch = int(runner.invoke(cli, ["--data-dir", cluster, "broker", "register", "--broker-id", "1"]).output)
    args = [*PIDCTL, "--data-dir", cluster, "allocate", "--broker-id", "1", "--broker-epoch", str(epoch), "--count",
            "300", "-o", "json"]
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=slave, text=True,
                                env={**os.environ, "TERM": "xterm", "COLUMNS": "100"})
        os.close(slave)
        seen = b""
        while True:  # read the terminal until the process closes it
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: no writer left
                break
            if not chunk:
                break
            seen += chunk
        out, _ = proc.communicate(timeout=60)
    finally:
        os.close(master)
    assert proc.returncode == 0
    assert len(json.loads(out)) == 300
    assert b"broker 1" in seen and b"/300" in seen and b"blocks" in seen  # the bar: "broker 1 ... 120/300 blocks"
    piped = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert piped.returncode == 0 and piped.stderr == ""  # not a terminal: nothing extra
