"""pidctl blocks history: a file that is not an audit trail is refused, and --quorum never reads the
local directory's files in silence."""
from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from cli.common import EXIT_ERROR, EXIT_USAGE
from cli.main import cli
from quorum.localcluster import LocalCluster
from tests.conftest import wait_for

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


@pytest.fixture
def pidctl(tmp_path):
    data_dir = str(tmp_path / "pq")
    runner = CliRunner()

    def invoke(*args, expect=0):
        result = runner.invoke(cli, ["--data-dir", data_dir, "--timeout", "15", *args])
        assert expect is None or result.exit_code == expect, (result.exit_code, result.output, result.exception)
        return result

    invoke.data_dir = data_dir
    yield invoke
    LocalCluster(data_dir).down(timeout=5)


def test_a_file_that_is_not_an_audit_trail_is_refused(pidctl, tmp_path):
    r = pidctl("blocks", "history", "--audit", README, expect=EXIT_ERROR)
    assert r.output.strip().splitlines() == [f"error: {README}: not an audit trail (no audit line at its start)"]
    junk = tmp_path / "audit.log"
    junk.write_bytes(b"\x00" * 3)  # shorter than a line's header
    assert str(junk) in pidctl("blocks", "history", "--audit", str(junk), expect=EXIT_ERROR).output
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")  # a node that applied nothing yet: no blocks, not an error
    assert "0 blocks" in pidctl("blocks", "history", "--audit", str(empty)).output


def test_quorum_option_is_not_answered_from_the_local_files(pidctl):
    pidctl("cluster", "up")
    epoch = json.loads(pidctl("broker", "register", "--broker-id", "1", "-o", "json").output)["broker_epoch"]
    pidctl("allocate", "--broker-id", "1", "--broker-epoch", str(epoch))
    quorum = ",".join(LocalCluster(pidctl.data_dir).client_addresses())
    r = pidctl("--quorum", quorum, "blocks", "history", expect=EXIT_USAGE)
    assert "reads the nodes' audit files" in r.output and "--audit FILE" in r.output
    assert "Traceback" not in r.output
    trail = os.path.join(pidctl.data_dir, "node-1", "audit.log")  # node 1 may apply the block after the answer

    def history():
        return json.loads(pidctl("--quorum", quorum, "blocks", "history", "--audit", trail, "-o", "json").output)
    wait_for(history, 15, what="node 1 to apply the block")
    assert [(b["broker_id"], b["broker_epoch"]) for b in history()] == [(1, epoch)]
