"""pidctl cluster up / reset through click's CliRunner, against real local clusters: settings fixed at
creation are refused when asked otherwise, a running cluster is said to be up, reset stops and deletes."""
from __future__ import annotations

import json
import os

from cli.common import EXIT_ERROR, EXIT_OK
from quorum.localcluster import LocalCluster, _alive


def test_up_refuses_other_settings_says_already_up_and_reset_starts_over(pidctl):
    first = json.loads(pidctl("cluster", "up", "-o", "json").output)
    assert first["already_up"] is False and first["settings"] == {"nodes": 3, "block_size": 1000, "metrics": False}
    assert len(first["client_addresses"]) == 3 and all(n["pid"] for n in first["nodes"])

    again = pidctl("cluster", "up")
    assert again.output.startswith(f"cluster already up in {first['data_dir']}: 3 nodes")

    refused = pidctl("cluster", "up", "--nodes", "5", "--metrics", expect=EXIT_ERROR)
    assert len(refused.output.strip().splitlines()) == 1
    assert "nodes 3 (asked 5), metrics off (asked on)" in refused.output
    assert "cluster reset" in refused.output and "Traceback" not in refused.output
    pidctl("cluster", "up", "--block-size", "10", expect=EXIT_ERROR)
    pidctl("cluster", "up", "--nodes", "3")  # the same as the cluster's: fine
    lc = LocalCluster(pidctl.data_dir)
    assert lc.running() and len(lc.nodes()) == 3

    # Not confirmed: nothing stopped or deleted.
    r = pidctl("cluster", "reset", input="n\n", expect=EXIT_ERROR)
    assert "nothing stopped or deleted" in r.output
    pidctl("cluster", "reset", input="", expect=EXIT_ERROR)  # no answer
    assert lc.running()

    pids = [n.pid for n in lc.nodes()]
    open(os.path.join(pidctl.data_dir, "mine.txt"), "w").close()  # not the cluster's: kept
    r = pidctl("cluster", "reset", input="y\n")
    assert "stopped and deleted; kept what it did not write: mine.txt" in r.output
    assert not any(_alive(p) for p in pids)
    assert os.listdir(pidctl.data_dir) == ["mine.txt"]
    os.unlink(os.path.join(pidctl.data_dir, "mine.txt"))

    # A new cluster with the settings once refused.
    new = json.loads(pidctl("cluster", "up", "--nodes", "1", "--metrics", "-o", "json").output)
    assert new["settings"]["nodes"] == 1 and new["settings"]["metrics"] is True
    assert new["nodes"][0]["metrics_address"]
    assert "stopped and deleted" in pidctl("cluster", "reset", "--yes").output
    assert not os.path.exists(pidctl.data_dir)
    r = pidctl("cluster", "reset", "--yes", expect=EXIT_OK)
    assert "nothing to reset" in r.output
