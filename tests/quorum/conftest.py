"""Fixtures shared by the quorum's tests: a state for the generate/replay tests (no Raft running), the
journal tests' file, a module-scoped cluster for the bad-input tests."""
from __future__ import annotations

import pytest

from quorum.localcluster import LocalCluster
from quorum.managers import QuorumState
from tests.conftest import ClusterHarness

NOW = 1_700_000_000_000  # ms: the registration's timestamp


@pytest.fixture
def state() -> QuorumState:
    """A state with broker 1 registered (epoch 1).  A module that needs another start defines its own."""
    s = QuorumState()
    for rec in s.registrations.generate_register(1, "inc-1", "h:1", NOW).records:
        s.replay(rec)
    return s


@pytest.fixture
def path(tmp_path) -> str:
    """The journal's file (test_journal*); a module with other files defines its own ``path``."""
    return str(tmp_path / "raft.journal")


@pytest.fixture(scope="module")
def qcluster(tmp_path_factory):
    """A real three-node quorum serving a whole module (test_bad_input*)."""
    lc = LocalCluster(str(tmp_path_factory.mktemp("bad-input") / "cluster"))
    try:
        lc.up(3)
        harness = ClusterHarness(lc)
        harness.leader(timeout=20)
        yield harness
    finally:
        lc.down(timeout=5)
