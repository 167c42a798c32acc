"""Liveness of a simulated quorum: bounds after the last fault heals, figures after every heal.

After the last fault heals (``Simulation._converge``) the cluster must have a leader that a majority of
its members follows within ``LEADER_BOUND`` simulated seconds, and a client request must be committed
within ``COMMIT_BOUND``; a miss is a failure of the seed, like a safety violation.  During the run every
heal (a partition healed, a node restarted, a disk freed or fast again, a paused node resumed) starts a
measurement that ends at the first moment a leader that a majority follows exists: a figure, not a
verdict (faults go on meanwhile).  The watch only reads the nodes: it draws nothing from the seed and
schedules no event, so it moves no run.
"""
from __future__ import annotations

import math
from typing import Iterable

from .node import Cluster, SimulatedNode

# Simulated seconds from the last heal (every member started, the network whole) to a leader that a
# majority follows.  What the production timing allows in the slowest legitimate path (RaftConfig's
# defaults, which the simulation runs): a link the heal left closed is dialled again within
# connection_timeout (1 s) plus reconnect_interval (0.1 s); a node that starts waits for its peers' word
# (a round trip on those links); a node still in an old leader's term stays a follower until its
# election timeout (at most election_timeout_max, 0.5 s) and a leader cut off steps down within
# leader_step_down_timeout (1 s); then each election round lasts at most 0.5 s, and with timeouts drawn
# from [0.25, 0.5] s a round splits (two candidates within a message delay of each other) rarely: four
# split rounds in a row add 2 s.  1.1 + 0.5 + 1 + 2.5 is about 5 s.  A node restarted on a copy of its
# data directory, or a disk the heal found full, adds nothing: a majority of the others elects.
LEADER_BOUND = 5.0
# Simulated seconds from the last heal to the answer of one client request (a broker registration sent
# the way the workload sends its requests).  The leader bound, then the new leader's first entry of its
# term committed (Raft commits nothing of an earlier term before it) and the request's own entry: a few
# heartbeats (0.05 s) each on a whole network; a majority that first needs the leader's snapshot (in
# chunks of 256 bytes on some seeds) or a catch-up of the leader's log (one AppendEntries batch per
# answer) adds a few seconds more.
COMMIT_BOUND = 10.0


def majority_leader(sim: Cluster) -> SimulatedNode | None:
    """The node that leads with a majority of its own configuration following it in its term (itself
    included), if there is one; a leader cut off from its followers, or one that a newer term deposed
    on the others, is not."""
    up = [n for n in sim.nodes.values() if n.running and not n.paused]
    leaders = [n for n in up if n.raft.is_leader]  # most calls end here: no leader
    if not leaders:
        return None
    by_address = {n.address: n for n in up}
    for n in leaders:
        raft = n.raft
        term = raft.raft_term
        members = raft.members()
        following = 1
        for address in members[1:]:
            other = by_address.get(address)
            if other is None:
                continue
            is_leader, leader, other_term = other.raft.role()
            if not is_leader and leader == n.address and other_term == term:
                following += 1
        if following > len(members) // 2:
            return n
    return None


class Watch:
    """Times from each heal during the run to the first leader a majority follows (``after``, called
    after every event), and the figures of the final heal (``Simulation._converge`` fills those)."""

    HEALS = {"_heal": "partition", "_free_disk": "disk freed", "_fast_disk": "disk fast again",
             "_restart": "restart", "_resume": "resumed"}

    def __init__(self, sim: Cluster):
        self.sim = sim
        self.pending: list[float] = []   # heals not yet followed by a leader a majority follows
        self.mid_run: list[float] = []   # seconds from such a heal to that leader
        self.heals = 0                   # heals during the run
        self.with_leader = 0             # ... that found a leader a majority follows at once
        self.open_at_end = 0             # ... still without such a leader when the faults stopped
        self.ended = False               # the faults stopped: the final heal is judged, not measured here
        self.leader_after_heal: float | None = None   # the final heal's figures
        self.commit_after_heal: float | None = None

    def faults_stop(self) -> None:
        self.open_at_end, self.ended = len(self.pending), True
        self.pending.clear()

    def after(self, kind: str, fn) -> None:
        heal = kind in ("heal", "restart") and getattr(fn, "__name__", "") in self.HEALS and not self.ended
        if not heal and not self.pending:
            return
        now = self.sim.clock.now
        if majority_leader(self.sim) is not None:
            self.mid_run.extend(round(now - t, 4) for t in self.pending)
            self.pending.clear()
            if heal:
                self.heals += 1
                self.with_leader += 1
        elif heal:
            self.heals += 1
            self.pending.append(now)

    def figures(self) -> dict:
        return {"leader_after_heal": self.leader_after_heal, "commit_after_heal": self.commit_after_heal,
                "heals": self.heals, "heals_with_leader": self.with_leader, "heals_open_at_end": self.open_at_end,
                "leader_after_mid_run_heal": list(self.mid_run)}


def summary(values: Iterable[float]) -> dict:
    """count, median, p99 (nearest rank) and max of ``values``, in seconds (None when there are none)."""
    xs = sorted(values)
    if not xs:
        return {"count": 0, "median": None, "p99": None, "max": None}
    mid = len(xs) // 2
    median = xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2
    p99 = xs[max(0, math.ceil(0.99 * len(xs)) - 1)]
    return {"count": len(xs), "median": round(median, 4), "p99": round(p99, 4), "max": round(xs[-1], 4)}


__all__ = ["LEADER_BOUND", "COMMIT_BOUND", "majority_leader", "Watch", "summary"]
