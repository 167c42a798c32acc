"""Fixtures of the quorum's generate/replay tests (no Raft running)."""
from __future__ import annotations

import pytest

from quorum.managers import QuorumState

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
