"""Replication never loses a committed entry: what a follower commits from a message, terms, votes and
acknowledgements delivered twice or late, campaigns, and the Raft port's address.  Real nodes on a
``SimDisk``, one regression test per defect found by review or by the deterministic simulation."""
from __future__ import annotations

from chaos.sim.disk import NodeHalted
from quorum.raft import clock
from snapshots.storage.disk import EXIT_DIVERGED
from tests.quorum.raft_messages import deliver, fake_peer, on_raft, vouch
from tests.support.inproc import SimCluster
from tests.quorum.durability_steps import _append_term_1_tail


def test_follower_never_commits_from_a_message_that_verified_nothing():
    """Defect 5: a snapshot chunk, or the serialized=None message sent after every compaction, advanced a
    follower's commit index over its own uncommitted tail from an old term."""
    with SimCluster(start=False) as c:
        n = c.nodes[1]
        n.start()
        obj, journal = n.raft._obj, n.raft.journal
        leader = fake_peer(c, 2)
        _append_term_1_tail(n, leader, commit_index=1)
        assert journal.durable_end() == (1, 5) and obj.raftCommitIndex == 1  # an uncommitted tail of term 1
        applied = obj.raftLastApplied
        for message in ({"type": "append_entries", "term": 5, "commit_index": 5, "serialized": None},
                        {"type": "append_entries", "term": 5, "commit_index": 5, "serialized": (b"xx", True, False)}):
            deliver(n, leader, message)
            assert obj.raftCommitIndex == 1 and obj.raftLastApplied == applied


def test_appendentries_with_an_older_prev_index_keeps_matching_entries():
    """Defect 6: pysyncobj cut the log after every prevLogIdx, even where entries matched (Raft 5.3: only at
    the first conflict), so a delayed AppendEntries threw away acknowledged entries."""
    with SimCluster(start=False) as c:
        n = c.nodes[1]
        n.start()
        journal = n.raft.journal
        leader = fake_peer(c, 2)
        entries = [(b"\x01", i, 2) for i in range(2, 11)]
        deliver(n, leader, {"type": "append_entries", "term": 2, "commit_index": 1, "prevLogIdx": 1,
                             "prevLogTerm": 0, "entries": entries})
        assert journal.entries[-1][1] == 10
        deliver(n, leader, {"type": "append_entries", "term": 2, "commit_index": 1, "prevLogIdx": 4,
                             "prevLogTerm": 2, "entries": entries[3:5]})
        assert journal.entries[-1][1] == 10 and journal.durable_end() == (2, 10)
        # a real conflict is cut, from the first conflicting entry on
        deliver(n, leader, {"type": "append_entries", "term": 3, "commit_index": 1, "prevLogIdx": 6,
                             "prevLogTerm": 2, "entries": [(b"\x01", 7, 3)]})
        assert [(e[1], e[2]) for e in journal.entries[-3:]] == [(5, 2), (6, 2), (7, 3)]


def test_a_leader_sending_another_term_where_this_node_committed_stops_it():
    """Log matching says it never happens: an entry this node committed conflicts with the leader's.  Then a
    log diverged (a bug, or a copy of another cluster's files), and the node stops with EXIT_DIVERGED
    naming the index, rather than cut a committed entry or acknowledge around it."""
    with SimCluster(start=False) as c:
        n = c.nodes[1]
        n.start(trust_own_log=True)
        leader = fake_peer(c, 2)
        _append_term_1_tail(n, leader, commit_index=4)
        assert n.raft.commit_index == 4
        journal = n.raft.journal
        try:
            deliver(n, leader, {"type": "append_entries", "term": 2, "commit_index": 4, "prevLogIdx": 2,
                                 "prevLogTerm": 1, "entries": [(b"\x02", 3, 2)]})
        except NodeHalted:
            pass
        c.wait(lambda: n.halted is not None, what="the node to stop")
        assert n.halted[0] == EXIT_DIVERGED and "entry 3" in n.halted[1]
        assert journal.entry(3)[2] == 1 and journal.durable_end() == (1, 5)  # nothing cut


def test_a_follower_whose_leader_connection_closes_campaigns_within_half_the_minimum_election_timeout():
    """kill -9 of a leader closes its connections at once: its followers need not wait a whole election timeout
    (the bench's outage went from ~0.4 s to ~0.06 s).  Another peer's connection closing changes nothing."""
    with SimCluster(start=False) as c:
        n = c.nodes[1]
        n.start()
        obj = n.raft._obj
        vouch(n, c, 2, log_end=[0, 1], held=None, term=0)
        vouch(n, c, 3, log_end=[0, 1], held=None, term=0)
        assert n.raft.vouched and not n.raft.restricted
        leader, other = fake_peer(c, 2), fake_peer(c, 3)
        got = {}

        def heartbeat_then_close(node):
            # In one tick: the deadline is fresh (the node may wait a tick between calls).
            obj.on_message(leader, {"type": "append_entries", "term": 1, "commit_index": 1,
                                                     "prevLogIdx": 1, "prevLogTerm": 0, "entries": []})
            got["before"], got["at"] = obj.election_deadline, clock()
            obj.on_node_disconnected(node)
            got["after"], got["wait"] = obj.election_deadline, n.raft.tick_wait()

        on_raft(n, lambda: heartbeat_then_close(other))
        assert got["after"] == got["before"] > got["at"] + n.cfg.raft.election_timeout_min / 2
        on_raft(n, lambda: heartbeat_then_close(leader))
        assert got["after"] < got["before"] and got["after"] <= got["at"] + n.cfg.raft.election_timeout_min / 2, got
        assert got["wait"] <= max(got["after"] - got["at"], 0) + 0.001  # the node's loop wakes for it


def test_raft_port_binds_the_advertised_host_not_every_interface():
    """Defect 7: with no raft_bind, pysyncobj bound 0.0.0.0."""
    with SimCluster(size=1) as c:
        port = int(c.nodes[1].cfg.raft_address.rsplit(":", 1)[1])
        assert _listening_addresses(port) == {"127.0.0.1"}


def _listening_addresses(port: int) -> set[str]:
    out = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            local, state = fields[1], fields[3]
            addr, p = local.rsplit(":", 1)
            if state == "0A" and int(p, 16) == port:
                if len(addr) == 8:
                    out.add(".".join(str(int(addr[i:i + 2], 16)) for i in (6, 4, 2, 0)))
                else:
                    out.add("::" if set(addr) == {"0"} else addr)
    return out


# --------------------------------------------------- found by the deterministic simulation
def _node_one_alone(c, setup, what: str):
    """Start node 1 only and run ``setup(node, syncobj)`` in its next tick (the state a test needs)."""
    n = c.nodes[1]
    n.start()
    obj = n.raft._obj
    done = []

    def run():
        setup(n, obj)
        done.append(True)
    n.raft._on_raft_thread(run)
    c.wait(lambda: done, what=what)
    return n, obj


def test_a_vote_delivered_twice_counts_once():
    """pysyncobj counted vote messages, not voters: in a five-node cluster, its own vote plus one vote
    delivered twice made a "majority" and two leaders in one term (simulation, five nodes, duplication)."""
    with SimCluster(size=5, start=False) as c:
        def become_candidate(n, obj):
            obj.set_term(5, n.cfg.raft_address)
            obj.set_state(1)
            obj.votes_count = 1
        n, obj = _node_one_alone(c, become_candidate, "the candidate")
        for _ in range(2):
            deliver(n, fake_peer(c, 2), {"type": "response_vote", "term": 5})
        assert not n.raft.role()[0]  # 2 voters of 5, however many messages
        deliver(n, fake_peer(c, 3), {"type": "response_vote", "term": 5})
        assert n.raft.role()[0]


def test_an_acknowledgement_from_another_term_is_ignored():
    """pysyncobj's acknowledgements carried no term: a delayed success from an earlier term raised the
    leader's match index for a follower whose log was cut since, and an entry was committed that the
    majority did not hold.  Acknowledgements now carry their term; the leader ignores other terms'."""
    with SimCluster(start=False) as c:
        def become_leader(n, obj):
            obj.set_term(7, n.cfg.raft_address)
            obj.become_leader()
        n, obj = _node_one_alone(c, become_leader, "the leader")
        peer = fake_peer(c, 2)
        stale = {"type": "next_node_idx", "next_node_idx": 3, "reset": False, "success": True, "term": 5}
        deliver(n, peer, stale)
        assert obj.match_index[peer] == 0
        deliver(n, peer, dict(stale, term=7))
        assert obj.match_index[peer] == 2


def test_a_leader_answered_with_a_higher_term_steps_down_into_it():
    """Raft: a response with a higher term deposes its receiver.  pysyncobj read the terms of requests only,
    so a leader that a held-back follower answered from a higher term (a follower that never campaigns)
    led on below it, and that follower refused its AppendEntries for good."""
    with SimCluster(start=False) as c:
        def become_leader(n, obj):
            obj.set_term(7, n.cfg.raft_address)
            obj.become_leader()
        n, obj = _node_one_alone(c, become_leader, "the leader")
        deliver(n, fake_peer(c, 2), {"type": "next_node_idx", "next_node_idx": 1, "reset": False,
                                       "success": False, "term": 9})
        assert obj.term == 9 and obj.voted_for is None and not n.raft.role()[0]


def test_a_candidate_from_an_earlier_term_is_told_the_term_and_follows_it():
    """pysyncobj dropped a RequestVote from an earlier term in silence and never read a vote response's
    term: a candidate that missed a term (its view of the membership heard from nobody else) campaigned
    below the others forever while they could elect nobody without it (simulation, seed 102068)."""
    with SimCluster(start=False) as c:
        sent = []

        def follower_in_term_9(n, obj):
            obj.set_term(9, None)
            transport = obj.transport
            original = transport.send
            transport.send = lambda node, message: (sent.append((node.address, message)), original(node, message))
        n, obj = _node_one_alone(c, follower_in_term_9, "the follower")
        candidate = fake_peer(c, 2)
        deliver(n, candidate, {"type": "request_vote", "term": 7, "last_log_index": 99, "last_log_term": 7})
        assert (candidate.address, {"type": "response_vote", "term": 9, "granted": False}) in sent
        assert obj.term == 9 and obj.voted_for is None

        def candidate_in_term_10(n, obj):
            obj.set_term(10, n.cfg.raft_address)
            obj.set_state(1)
            obj.votes_count = 1
        on_raft(n, lambda: candidate_in_term_10(n, obj))
        deliver(n, fake_peer(c, 3), {"type": "response_vote", "term": 10, "granted": False})
        assert obj.votes_count == 1 and obj.state == 1  # a denial is not a vote
        deliver(n, fake_peer(c, 3), {"type": "response_vote", "term": 12, "granted": False})
        assert obj.term == 12 and obj.state == 0
