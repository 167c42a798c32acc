"""pidctl migrate's --zk is checked before anything is asked of ZooKeeper or the quorum: a bad one is a
usage error (exit 2) on one line, never a quorum switched into bridge mode with an address kazoo cannot reach."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from cli.common import EXIT_USAGE
from cli.main import cli
from cli.migrate import ZK_HOSTS


@pytest.mark.parametrize("command", [["migrate", "bridge"], ["migrate", "from-zk"], ["migrate", "export", "--out", "x"]])
@pytest.mark.parametrize("zk, why", [("127.0.0.1:99999", "is not host:port"), ("foo", "is not host:port"),
                                     ("127.0.0.1:2181,:7", "is not host:port"),
                                     ("127.0.0.1:2181/", "is not a znode path"),
                                     ("127.0.0.1:2181/a//b", "is not a znode path")])
def test_a_bad_zookeeper_connect_string_is_a_usage_error(tmp_path, command, zk, why):
    r = CliRunner().invoke(cli, ["--data-dir", str(tmp_path / "none"), *command, "--zk", zk])
    assert r.exit_code == EXIT_USAGE, r.output
    assert "--zk" in r.output and why in r.output and "Traceback" not in r.output


def test_a_chroot_and_several_hosts_are_accepted():
    assert ZK_HOSTS.convert("h1:2181, h2:2182/kafka/prod", None, None) == "h1:2181,h2:2182/kafka/prod"
