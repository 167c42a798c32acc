"""Commands that ask every node (``gather_status``) name each node's reason when none answers, in one line
for ``blocks latest`` (was "error: no node answered"), in a line per node for ``quorum status`` and
``cluster status``."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from benchmarks.pki import make_pki
from cli.common import EXIT_UNAVAILABLE
from cli.main import cli
from quorum.localcluster import LocalCluster, free_ports


def pidctl(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(cli, list(args))
    assert "Traceback" not in r.output, r.output
    return r.exit_code, r.output


@pytest.fixture
def stopped_cluster(tmp_path):
    """A local cluster of three nodes, all stopped: its --data-dir."""
    lc = LocalCluster(str(tmp_path / "pq"))
    lc.up(3)
    lc.down(timeout=5)
    return lc


def test_blocks_latest_names_each_node_and_why(stopped_cluster):
    lc = stopped_cluster
    rc, out = pidctl("--data-dir", lc.dir, "--timeout", "2", "blocks", "latest")
    assert rc == EXIT_UNAVAILABLE
    assert out == f"error: no node answered: {', '.join(lc.client_addresses())}: Connection refused\n"


def test_blocks_latest_without_the_ca_says_so(tmp_path):
    pki = make_pki(str(tmp_path / "pki"))
    lc = LocalCluster(str(tmp_path / "tls"))
    lc.up(1, tls_certfile=pki.certfile, tls_keyfile=pki.keyfile, tls_cafile=pki.cafile)
    try:
        (address,) = lc.client_addresses()
        rc, out = pidctl("--quorum", address, "--security-protocol", "SSL", "blocks", "latest")
        assert rc == EXIT_UNAVAILABLE
        assert out == (f"error: no node answered: {address}: TLS certificate verify failed (self-signed certificate "
                       f"in certificate chain): pass --tls-cafile with the CA that signed the quorum's certificates\n")
        rc, out = pidctl("--quorum", address, "blocks", "latest")
        assert rc == EXIT_UNAVAILABLE
        assert out == (f"error: no node answered: {address}: closed the connection without an answer: it is a TLS "
                       f"port (--security-protocol SSL)\n")
        rc, out = pidctl("--quorum", address, "--security-protocol", "SSL", "--tls-cafile", pki.cafile, "blocks",
                         "latest", "-o", "json")
        assert rc == 0 and '"next_producer_id"' in out, out
    finally:
        lc.down(timeout=5)


def test_quorum_status_and_cluster_status_name_each_node_and_why(stopped_cluster):
    lc = stopped_cluster
    for command in (("quorum", "status"), ("cluster", "status")):
        rc, out = pidctl("--data-dir", lc.dir, "--timeout", "2", *command)
        for n in lc.nodes():
            assert f"node {n.node_id} is down: {n.client_address}: Connection refused\n" in out, (command, out)
        # the health line, last: why no node answered, and the exit code of an unavailable quorum
        assert rc == EXIT_UNAVAILABLE, (command, rc, out)
        assert out.rstrip().splitlines()[-1].startswith(f"warning: unavailable: 0 of {len(lc.nodes())} nodes "
                                                         "answered: "), (command, out)
        assert out.rstrip().endswith(": Connection refused"), (command, out)
    rc, out = pidctl("--quorum", ",".join(f"127.0.0.1:{p}" for p in free_ports(2)), "--timeout", "2", "quorum",
                     "status")
    assert rc == EXIT_UNAVAILABLE and out.count(": Connection refused\n") == 3, out  # two nodes, the health line
