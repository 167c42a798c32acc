"""README's "Using it", then its broker example, run as written after ``pidctl demo``, in a fresh directory: the
test reads the blocks from README.md, so it follows the README."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

from quorum.localcluster import LocalCluster, free_ports

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)  # the venv's bin, where pidctl is
README_PORTS = ("19092", "19096")  # the broker's Kafka and metrics ports in the block: free ones here


def readme_block(heading: str) -> str:
    """The first ```sh block under ``heading`` (a line of README.md, e.g. "## Using it"), up to the next heading."""
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    section = text.split(f"\n{heading}\n", 1)[1]
    section = re.split(r"^#{2,3} ", section, maxsplit=1, flags=re.M)[0]
    match = re.search(r"^```sh\n(.*?)^```", section, re.S | re.M)
    assert match, f"no ```sh block under {heading} in README.md"
    return match.group(1)


def using_it_block() -> str:
    return readme_block("## Using it")


BROKER_HEADING = "### A Kafka broker that takes its producer IDs from the quorum"


def test_readme_using_it_runs_as_written_after_the_demo(tmp_path):
    block = using_it_block()
    ports = dict(zip(README_PORTS, map(str, free_ports(len(README_PORTS)))))
    for port, free in ports.items():
        assert port in block, f"README's Using it no longer uses port {port}: update README_PORTS"
        block = block.replace(port, free)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIDQUORUM_")}
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
    shell = None
    try:
        demo = subprocess.run(["pidctl", "demo"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert demo.returncode == 0, demo
        # set -e: the first command that exits other than 0 stops the script with its code; -x names it.  Its own
        # session, so that a broker it left running is stopped below.
        shell = subprocess.Popen(["bash", "-exc", block], cwd=tmp_path, env=env, text=True, start_new_session=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = shell.communicate(timeout=300)
        assert shell.returncode == 0, f"exit {shell.returncode}\n--- stdout\n{out}\n--- stderr\n{err}"
        assert "Traceback" not in err
        assert f"127.0.0.1:{ports['19096']}" in out  # broker status read the broker's metrics
        assert not LocalCluster(str(tmp_path / ".pidquorum")).running()  # the block's last line stopped it

        # The next example: a broker a confluent-kafka producer writes to idempotently (its pip install finds
        # the package the test extras installed: nothing is downloaded).
        broker = readme_block(BROKER_HEADING)
        assert "19092" in broker, "README's broker example no longer uses port 19092: update the test"
        broker = broker.replace("19092", ports["19092"])
        shell = subprocess.Popen(["bash", "-exc", broker], cwd=tmp_path, env=env, text=True, start_new_session=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = shell.communicate(timeout=300)
        assert shell.returncode == 0, f"exit {shell.returncode}\n--- stdout\n{out}\n--- stderr\n{err}"
        assert "undelivered: 0" in out and "Traceback" not in err
        assert "Connection refused" not in err  # the producer starts once the broker serves
        assert not LocalCluster(str(tmp_path / ".pidquorum")).running()
    finally:
        if shell is not None:
            try:
                os.killpg(shell.pid, signal.SIGKILL)  # the broker, if the block stopped before its kill
            except ProcessLookupError:
                pass
            shell.communicate()
        LocalCluster(str(tmp_path / ".pidquorum")).down(timeout=5)
