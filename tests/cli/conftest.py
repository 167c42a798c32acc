"""``pidctl``: the CLI through click's CliRunner on a data directory of the test's own."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from cli.main import cli
from quorum.localcluster import LocalCluster


@pytest.fixture
def pidctl(tmp_path):
    """``pidctl(*args, expect=0, input=None)`` runs ``pidctl --data-dir <tmp> --timeout 15 *args`` and checks
    its exit code (``expect=None``: any); the cluster it may have started is stopped afterwards."""
    data_dir = str(tmp_path / "pq")
    runner = CliRunner()

    def invoke(*args, expect=0, input=None):
        result = runner.invoke(cli, ["--data-dir", data_dir, "--timeout", "15", *args], input=input)
        assert expect is None or result.exit_code == expect, (result.exit_code, result.output, result.exception)
        return result

    invoke.data_dir = data_dir
    yield invoke
    LocalCluster(data_dir).down(timeout=5)
