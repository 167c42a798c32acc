"""A command proposed on a node that does not lead is refused, never forwarded to the leader (pysyncobj
forwards it; the adapter does not): it is a batch generated on that node's state, which may be stale
(seed 510431 of the transaction simulation)."""
from __future__ import annotations

import pytest

from quorum.raft import ProposalRejected
from tests.support.inproc import SimCluster


def test_a_followers_proposal_is_refused_and_in_no_log():
    with SimCluster() as c:
        leader = c.leader()
        c.register(1)
        follower = next(n for n in c.running() if n is not leader)
        with pytest.raises(ProposalRejected, match="not the leader"):
            c._propose(follower, [], 5.0)  # pysyncobj would forward it and the leader would apply it
        assert c.register(2) > 0  # the cluster serves on
