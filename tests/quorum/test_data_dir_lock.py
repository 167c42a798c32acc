"""One node per data directory: a second node started on a directory a running node holds stops at once
(exit 69), naming the directory and the holder's pid."""
from __future__ import annotations

import os
import subprocess
import sys

from quorum.localcluster import LocalCluster
from snapshots.storage.disk import EXIT_UNAVAILABLE


def test_a_second_node_on_a_held_data_directory_is_refused(tmp_path):
    lc = LocalCluster(str(tmp_path / "c"))
    lc.up(3)
    try:
        node = lc.nodes()[0]
        second = subprocess.run([sys.executable, "-m", "cli.main", "node", "start", "--config",
                                 lc.config_path(node.node_id)], capture_output=True, text=True, timeout=60,
                                cwd=lc.dir)
        assert second.returncode == EXIT_UNAVAILABLE, second
        lines = [line for line in second.stderr.splitlines() if "refusing to start" in line]
        assert len(lines) == 1, second.stderr
        assert f"is in use by another process (pid {node.pid})" in lines[0]
        assert "two nodes must not share a data directory" in lines[0]
        assert "Traceback" not in second.stderr
        assert lc.alive(node.node_id)
    finally:
        lc.down()
