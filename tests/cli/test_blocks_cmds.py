"""pidctl blocks history: a file that is not an audit trail is refused, and --quorum asks the nodes, never
the local directory's files."""
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


def test_a_file_that_is_not_an_audit_trail_is_refused(pidctl, tmp_path):
    r = pidctl("blocks", "history", "--audit", README, expect=EXIT_ERROR)
    assert r.output.strip().splitlines() == [f"error: {README}: not an audit trail (no audit line at its start)"]
    junk = tmp_path / "audit.log"
    junk.write_bytes(b"\x00" * 3)  # shorter than a line's header
    assert str(junk) in pidctl("blocks", "history", "--audit", str(junk), expect=EXIT_ERROR).output
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")  # a node that applied nothing yet: no blocks, not an error
    assert "0 blocks" in pidctl("blocks", "history", "--audit", str(empty)).output


def test_quorum_option_asks_the_nodes_not_the_local_files(pidctl, tmp_path):
    pidctl("cluster", "up")
    epoch = json.loads(pidctl("broker", "register", "--broker-id", "1", "-o", "json").output)["broker_epoch"]
    pidctl("allocate", "--broker-id", "1", "--broker-epoch", str(epoch))
    quorum = ",".join(LocalCluster(pidctl.data_dir).client_addresses())
    elsewhere = str(tmp_path / "elsewhere")  # no audit file there: the history comes from the nodes
    os.makedirs(elsewhere)

    def history(*extra):
        r = pidctl("--quorum", quorum, "blocks", "history", "--data-dir", elsewhere, "-o", "json", *extra)
        return [(b["broker_id"], b["broker_epoch"]) for b in json.loads(r.stdout)]
    assert history() == [(1, epoch)]  # every node's trail read: the one that applied the block has it
    assert history("--broker-id", "2") == []
    # --audit still reads the file given, --quorum or not
    trail = os.path.join(pidctl.data_dir, "node-1", "audit.log")  # node 1 may apply the block after the answer
    wait_for(lambda: history("--audit", trail), 15, what="node 1 to apply the block")
    assert history("--audit", trail) == [(1, epoch)]
    # without --quorum, a directory without audit files is an error that says what to pass
    r = pidctl("blocks", "history", "--data-dir", elsewhere, expect=EXIT_ERROR)
    assert r.output.strip() == f"error: no audit files in {elsewhere} (use --audit FILE, or --quorum)"


@pytest.mark.parametrize("broker_id", ["-5", "99999999999", "x"])
def test_blocks_history_refuses_a_broker_id_no_broker_can_have(tmp_path, broker_id):
    r = CliRunner().invoke(cli, ["--data-dir", str(tmp_path / "none"), "blocks", "history", "--broker-id", broker_id])
    assert r.exit_code == EXIT_USAGE and "--broker-id" in r.output, r.output
