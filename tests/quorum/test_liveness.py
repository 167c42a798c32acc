"""Liveness of the Raft package (issue 39): every vote request is answered with the voter's term, pre-vote,
check-quorum, and a restart after a membership change that reaches a decision without an operator.

Unit tests hand messages to one real node (``Replicated.on_message`` on its own loop, as
tests/quorum/test_durability.py does); the others run in-process clusters (pysyncobj over loopback TCP,
files on a ``SimDisk``) and wait on conditions with deadlines.
"""
from __future__ import annotations

import pickle

from quorum.raft import Node
from tests.quorum.raft_messages import deliver, fake_peer, on_raft, vouch
from tests.support.inproc import SimCluster

FOLLOWER, CANDIDATE, LEADER = 0, 1, 2


def _recording(n):
    """Every message node ``n``'s Raft layer sends from now on, as (address, message), in order."""
    sent = []

    def wrap():
        transport = n.raft._obj.transport
        original = transport.send

        def send(node, message):
            sent.append((node.address, message))
            return original(node, message)
        transport.send = send
    on_raft(n, wrap)
    return sent


def _alone(c, vouched: bool, term: int = 3):
    """Node 1 started alone (its peers never run) in ``term``; vouched for by both peers if ``vouched``."""
    n = c.nodes[1]
    n.start()
    if vouched:
        vouch(n, c, 2, log_end=[0, 1], held=None, term=0)
        vouch(n, c, 3, log_end=[0, 1], held=None, term=0)
        assert not n.raft.restricted
    obj = n.raft._obj
    on_raft(n, lambda: obj.set_term(term, None))
    return n, obj, _recording(n)


def _last(n) -> tuple[int, int]:
    """(index, term) of the last entry of node ``n``'s log."""
    entry = n.on_loop(lambda: n.raft.journal.entries[-1])
    return entry[1], entry[2]


def _heartbeat(c, n, leader_id: int, term: int):
    """An AppendEntries from node ``leader_id`` as leader in ``term`` (matching node 1's log: it verifies it)."""
    index, log_term = _last(n)
    deliver(n, fake_peer(c, leader_id), {"type": "append_entries", "term": term, "commit_index": 0,
                                           "prevLogIdx": index, "prevLogTerm": log_term, "entries": []})


def _answers(sent, address, kind):
    return [m for a, m in sent if a == address and m.get("type") == kind]


# ------------------------------------------------------- 1. a vote answer carries the voter's term
def test_a_held_back_node_takes_a_higher_term_from_a_vote_request_and_answers_a_lower_one_with_it():
    """Seed 302145: a candidate stayed below a held-back node's term.  A node not vouched for yet takes a
    higher term from a vote request and grants nothing; a request from a lower term is answered with its term
    (``_stale_term``, before the held-back node's rule).  No denial is sent in the candidate's own term: a node
    of an earlier version counts any ``response_vote`` of its term as a vote."""
    with SimCluster(start=False) as c:
        n, obj, sent = _alone(c, vouched=False)
        assert n.raft.restricted
        peer = fake_peer(c, 2).address
        deliver(n, fake_peer(c, 2), {"type": "request_vote", "term": 7, "last_log_index": 99, "last_log_term": 7})
        assert obj.term == 7 and obj.voted_for is None and _answers(sent, peer, "response_vote") == []
        deliver(n, fake_peer(c, 2), {"type": "request_vote", "term": 5, "last_log_index": 99, "last_log_term": 5})
        assert _answers(sent, peer, "response_vote") == [{"type": "response_vote", "term": 7, "granted": False}]


def test_a_vote_request_in_the_voters_own_term_is_granted_once_and_counted_once():
    """Raft's vote: a node that has not voted in its term grants a candidate of that term whose log is at least
    as up to date (the denial of a lower term must not reach the request of the node's own term), and it
    grants no second candidate in that term.  A candidate counts one voter once, and only its own term's
    grant: a grant of an earlier term marks no voter of this one."""
    with SimCluster(start=False) as c:
        n, obj, sent = _alone(c, vouched=True, term=9)
        first, second = fake_peer(c, 2), fake_peer(c, 3)
        ask = {"type": "request_vote", "term": 9, "last_log_index": 99, "last_log_term": 9}
        deliver(n, first, ask)
        assert obj.voted_for == first.address and obj.term == 9
        deliver(n, second, ask)
        assert obj.voted_for == first.address
        assert [m.get("granted", True) for m in _answers(sent, second.address, "response_vote")] in ([], [False])

        def candidate_in_term_10():
            obj.set_term(10, n.cfg.raft_address)
            obj.set_state(CANDIDATE)
            obj.votes_count = 1
        on_raft(n, candidate_in_term_10)
        deliver(n, first, {"type": "response_vote", "term": 9})  # a late grant of the last term
        deliver(n, first, {"type": "response_vote", "term": 10})
        assert obj.state == LEADER  # its own vote and the first peer's: two of three


def test_an_append_entries_from_a_lower_term_is_answered_with_this_nodes_term_and_changes_nothing():
    """A leader of an earlier term learns it was deposed from the answer (it then steps down:
    ``test_a_leader_answered_with_a_higher_term_steps_down_into_it``); nothing else tells it of the term a
    held-back node holds, which never campaigns."""
    with SimCluster(start=False) as c:
        n, obj, sent = _alone(c, vouched=False, term=9)
        stale = fake_peer(c, 2)
        before = _last(n)
        _heartbeat(c, n, 2, term=7)
        answers = _answers(sent, stale.address, "next_node_idx")
        assert answers and answers[-1]["term"] == 9 and answers[-1]["success"] is False
        assert obj.term == 9 and obj.leader is None and _last(n) == before


def test_a_vote_request_from_outside_the_configuration_is_answered_with_the_term_and_changes_nothing():
    """A candidate outside this node's configuration (a member removed, or one whose entry this node lacks) is
    refused, as before, but one below this node's term is told the term: it follows it instead of campaigning
    there forever.  A pre-vote from outside is answered alike."""
    with SimCluster(start=False) as c:
        n, obj, sent = _alone(c, vouched=True, term=9)
        outsider = Node("127.0.0.1:1")
        for term in (4, 9, 12):
            deliver(n, outsider, {"type": "request_vote", "term": term, "last_log_index": 99, "last_log_term": 9})
        assert _answers(sent, outsider.address, "response_vote") == [
            {"type": "response_vote", "term": 9, "granted": False}]
        deliver(n, outsider, {"type": "pq_pre_vote", "term": 5, "last_log_index": 99, "last_log_term": 9})
        assert _answers(sent, outsider.address, "pq_pre_vote_response") == [
            {"type": "pq_pre_vote_response", "term": 9, "pre_term": 5, "granted": False}]
        assert obj.term == 9 and obj.voted_for is None


# ----------------------------------------------------------------------------------- 2. pre-vote
def test_a_pre_vote_is_granted_only_to_an_up_to_date_log_while_no_leader_is_heard_and_changes_nothing():
    with SimCluster(start=False) as c:
        n, obj, sent = _alone(c, vouched=True, term=3)
        index, log_term = _last(n)
        asker = fake_peer(c, 2)

        def ask(term, last_term, last_index):
            deliver(n, asker, {"type": "pq_pre_vote", "term": term, "last_log_term": last_term,
                                "last_log_index": last_index})
            return _answers(sent, asker.address, "pq_pre_vote_response")[-1]

        assert ask(4, log_term, index) == {"type": "pq_pre_vote_response", "term": 3, "pre_term": 4, "granted": True}
        assert ask(4, log_term, index - 1)["granted"] is False  # a shorter log
        assert ask(3, log_term + 1, index)["granted"] is False  # its next term is not above this node's
        assert (obj.term, obj.voted_for, obj.state) == (3, None, FOLLOWER)  # a pre-vote changes nothing here
        _heartbeat(c, n, 3, term=3)
        assert ask(4, log_term, index) == {"type": "pq_pre_vote_response", "term": 3, "pre_term": 4,
                                           "granted": False}  # it hears a leader (check-quorum's lease)
        assert (obj.term, obj.voted_for) == (3, None)


def _cut_off(c, node_id: int):
    for other in c.nodes:
        if other != node_id:
            c.cut(node_id, other)


def test_a_node_campaigns_only_with_a_majority_of_pre_votes_each_voter_counted_once():
    """Raft thesis 9.6: when its election timer fires a node asks first, in its next term, and keeps its own
    term; only a majority of grants (itself included, each voter once) starts the election."""
    with SimCluster(size=5) as c:
        c.leader()
        n = c.nodes[1]
        _cut_off(c, 1)  # its links stay up, what it sends is lost
        sent = _recording(n)
        c.wait(lambda: any(m.get("type") == "pq_pre_vote" for _, m in sent), what="node 1's pre-vote")
        term = n.raft.raft_term
        asked = next(m for _, m in sent if m.get("type") == "pq_pre_vote")
        assert asked["term"] == term + 1 and not any(m.get("type") == "request_vote" for _, m in sent)

        def grant(peer_id):
            # In one tick with the round's state read: the timer may start a new round between two deliveries.
            def go():
                obj = n.raft._obj
                pre_term = obj._pre_vote.term
                obj.on_message(fake_peer(c, peer_id), {"type": "pq_pre_vote_response", "term": pre_term - 1,
                                                        "pre_term": pre_term, "granted": True})
            on_raft(n, go)

        for peer_id in (2, 2):
            grant(peer_id)
        assert n.raft.raft_term == term and not any(m.get("type") == "request_vote" for _, m in sent)
        grant(3)
        requests = [m for _, m in sent if m.get("type") == "request_vote"]
        assert requests and requests[0]["term"] == term + 1 and n.raft.raft_term == term + 1
        assert "transfer" not in requests[0]


def test_a_pre_vote_denial_from_a_higher_term_makes_the_node_follow_that_term():
    with SimCluster(start=False) as c:
        n, obj, _sent = _alone(c, vouched=True, term=3)
        deliver(n, fake_peer(c, 2), {"type": "pq_pre_vote_response", "term": 8, "pre_term": 4, "granted": False})
        assert (obj.term, obj.voted_for, obj.state) == (8, None, FOLLOWER)


def test_a_member_of_an_earlier_version_counts_as_a_pre_vote_so_a_rolling_upgrade_still_elects():
    """A node of an earlier version never answers a pre-vote: its hello lacks ``pre_vote``.  It is counted as
    granted (its real vote is its own), so node 1 with one such peer campaigns without any answer."""
    with SimCluster() as c:
        c.leader()
        n = c.nodes[2] if c.leader() is not c.nodes[2] else c.nodes[3]
        older = next(x for x in c.nodes.values() if x is not n and x is not c.leader())
        assert n.on_loop(lambda: not n.raft.votes_without_pre_vote(older.cfg.raft_address))
        n.raft.votes_without_pre_vote = lambda address: address == older.cfg.raft_address  # what its hello says
        _cut_off(c, n.node_id)
        sent = _recording(n)
        c.wait(lambda: any(m.get("type") == "request_vote" for _, m in sent), what="a campaign")
        assert not any(a == older.cfg.raft_address and m.get("type") == "pq_pre_vote" for a, m in sent)


def test_the_hello_says_whether_a_node_speaks_pre_vote():
    with SimCluster() as c:
        c.leader()
        for n in c.nodes.values():
            assert n.raft.hello_message()["pre_vote"] is True
            assert not any(n.on_loop(lambda n=n, x=x: n.raft.votes_without_pre_vote(x.cfg.raft_address))
                           for x in c.nodes.values() if x is not n)
        n, peer = c.nodes[1], c.nodes[2]
        hello = peer.on_loop(peer.raft.hello_message)
        older = {k: v for k, v in hello.items() if k != "pre_vote"}  # an earlier version's hello
        n.on_loop(lambda: n.raft._on_hello(fake_peer(c, 2), older))
        assert n.on_loop(lambda: n.raft.votes_without_pre_vote(peer.cfg.raft_address))
        n.on_loop(lambda: n.raft._on_hello(fake_peer(c, 2), hello))  # upgraded, reconnected
        assert not n.on_loop(lambda: n.raft.votes_without_pre_vote(peer.cfg.raft_address))


# ------------------------------------------------------------------------------ 3. check-quorum
def test_a_follower_that_hears_its_leader_ignores_a_vote_request_of_a_higher_term_but_not_a_transfer():
    with SimCluster(start=False) as c:
        n, obj, sent = _alone(c, vouched=True, term=3)
        index, log_term = _last(n)
        _heartbeat(c, n, 2, term=3)
        candidate = fake_peer(c, 3)
        request = {"type": "request_vote", "term": 5, "last_log_index": index, "last_log_term": log_term}
        deliver(n, candidate, request)
        assert (obj.term, obj.voted_for) == (3, None)  # neither granted nor its term taken
        assert _answers(sent, candidate.address, "response_vote") == []
        deliver(n, candidate, dict(request, transfer=True))  # the leader asked for this campaign
        assert (obj.term, obj.voted_for) == (5, candidate.id)
        assert _answers(sent, candidate.address, "response_vote")[-1] == {"type": "response_vote", "term": 5}


def test_a_follower_back_from_a_partition_does_not_depose_the_leader():
    """Pre-vote and check-quorum together (thesis 9.6, KIP-996): a follower cut off for several election
    timeouts keeps its term, and once the partition heals it follows the same leader in the same term."""
    with SimCluster() as c:
        c.register(1)
        leader = c.leader()
        term = leader.raft.raft_term
        follower = next(n for n in c.nodes.values() if n is not leader)
        _cut_off(c, follower.node_id)
        sent = _recording(follower)
        c.wait(lambda: sum(m.get("type") in ("pq_pre_vote", "request_vote") for _, m in sent) >= 3 * 2,
               what="three rounds of the cut-off follower's election timer")
        assert follower.raft.raft_term == term
        c.heal()
        c.wait(lambda: follower.raft.role()[1:] == (leader.raft.self_addr, term), what="the follower to follow again")
        c.register(2)
        assert leader.raft.is_leader and leader.raft.raft_term == term


def test_a_leader_cut_off_from_its_majority_steps_down_and_the_majority_elects_another():
    """Check-quorum's first half: pysyncobj's leaderFallbackTimeout (``leader_step_down_timeout``) makes a
    leader that heard from no majority for that long a follower."""
    with SimCluster() as c:
        c.register(1)
        leader = c.leader()
        term = leader.raft.raft_term
        _cut_off(c, leader.node_id)
        c.wait(lambda: not leader.raft.is_leader, timeout=leader.cfg.raft.leader_step_down_timeout + 2.0,
               what="the cut-off leader to step down")
        others = [n.node_id for n in c.nodes.values() if n is not leader]
        assert c.leader(among=others).raft.raft_term > term


def test_a_leadership_transfer_still_elects_its_target():
    """The followers hear the leader (check-quorum's lease) when its target campaigns: its vote requests say it
    is a transfer, so they vote."""
    with SimCluster() as c:
        c.register(1)
        leader = c.leader()
        target = next(n for n in c.nodes.values() if n is not leader)
        c.wait(lambda: leader.on_loop(lambda: leader.raft._obj.match_index.get(fake_peer(c, target.node_id), 0)
                                       == leader.raft.journal.entries[-1][1]), what="the target to be caught up")
        leader.raft.transfer_leadership(target.cfg.raft_address, timeout=5.0)
        c.wait(lambda: c.leader() is target, what="the target to lead")
        c.register(2)



# ------------------------------------------------- 4. a restart after a membership change
def test_a_copy_from_before_a_removal_is_vouched_for_by_the_peer_that_committed_it_even_after_its_restart():
    """Seed 301932's stall: a node whose configuration still holds a member that is gone needs that member's
    word, unless a peer reports a newer configuration whose entry it committed (its log holds every committed
    entry before it: the gone member's word adds nothing).  The committed flag came from the peer's commit
    index, which a restart takes from the journal's meta, written once a second: the leader that committed the
    removal and restarted within the second reported it uncommitted, and B, restored from a copy from before
    the removal, waited for C forever while A waited for B's vote.  A committed membership entry now makes
    the commit index that covers it durable at once."""
    with SimCluster() as c:
        epoch = c.register(1)
        a = c.leader()
        b, gone = [n for n in c.nodes.values() if n is not a]
        backup = b.disk.copy()  # B's copy: the configuration is (A, B, C)
        gone.crash()
        a.raft.remove_member(gone.cfg.raft_address, timeout=10.0)  # committed by A and B
        a.restart(a.disk.crash())  # within the second
        assert gone.cfg.raft_address not in a.raft.members()
        b.restart(backup)
        c.wait(lambda: b.raft.vouched and not b.raft.restricted, what="B to be vouched for and caught up")
        c.allocate(1, epoch, timeout=15.0)
        assert gone.cfg.raft_address not in b.raft.members()
        c.assert_no_block_reissued()


def test_a_snapshot_records_the_configuration_at_its_index_not_a_later_one():
    """Seed 400136: a snapshot at an index before a membership change recorded the configuration after it; a
    restart on it (or a follower that installed it) knew a membership that never held at that index, and when
    the change was cut it never knew the leader.  ``members_at`` undoes the changes after the index."""
    with SimCluster() as c:
        epoch = c.register(1)
        c.allocate(1, epoch)
        a = c.leader()
        gone = next(n for n in c.nodes.values() if n is not a)
        before = a.on_loop(lambda: a.raft.last_applied)
        everyone = sorted(n.cfg.raft_address for n in c.nodes.values())
        gone.crash()
        a.raft.remove_member(gone.cfg.raft_address, timeout=10.0)
        after = a.on_loop(lambda: a.raft.last_applied)
        assert after > before
        assert sorted(a.on_loop(lambda: a.raft._obj.members_at(before))) == everyone
        assert sorted(a.on_loop(lambda: a.raft._obj.members_at(after))) == sorted(set(everyone) - {gone.cfg.raft_address})


# ------------------------------------------------------------------------- found by the campaign
def test_an_entry_in_pieces_whose_last_two_pieces_both_say_finish_is_appended():
    """pysyncobj's leader labels a piece "finish" by the length of the entry's command, not of the pickled
    entry: when a piece boundary falls between the two, two pieces say "finish" and the first is a truncated
    pickle, on which the follower's tick failed (simulation seeds 177 and 332, large records)."""
    with SimCluster(start=False) as c:
        n, obj, _sent = _alone(c, vouched=True, term=3)
        index, log_term = _last(n)
        data = pickle.dumps((b"\x00" + b"x" * 2999, index + 1, 3), protocol=2)
        pieces = [data[:1000], data[1000:len(data) - 4], data[len(data) - 4:]]
        leader = fake_peer(c, 2)
        for label, piece in zip(("start", "finish", "finish"), pieces):
            deliver(n, leader, {"type": "append_entries", "transmission": label, "data": piece, "term": 3,
                                 "commit_index": 0, "prevLogIdx": index, "prevLogTerm": log_term})
        assert n.halted is None
        assert _last(n) == (index + 1, 3)


def test_pieces_without_their_start_or_of_another_entry_are_dropped_and_the_node_keeps_running():
    """A piece whose start was lost (or came for another place in the log, or before a snapshot install) starts
    nothing: pysyncobj appended it to an empty str buffer, a TypeError that stopped the node (simulation seed
    1491).  The whole entry, sent again from its start, is appended."""
    with SimCluster(start=False) as c:
        n, obj, _sent = _alone(c, vouched=True, term=3)
        index, log_term = _last(n)
        data = pickle.dumps((b"\x00" + b"x" * 2999, index + 1, 3), protocol=2)
        leader = fake_peer(c, 2)

        def piece(label, chunk, prev=index):
            deliver(n, leader, {"type": "append_entries", "transmission": label, "data": chunk, "term": 3,
                                 "commit_index": 0, "prevLogIdx": prev, "prevLogTerm": log_term})
        piece("process", data[1000:2000])  # its start was lost
        piece("finish", data[2000:])
        piece("start", data[:1000], prev=index - 1)  # another entry's start, then this one's rest
        piece("finish", data[1000:])
        assert n.halted is None and _last(n) == (index, log_term)
        piece("start", data[:1000])
        piece("process", data[1000:2000])
        piece("finish", data[2000:])
        assert n.halted is None and _last(n) == (index + 1, 3)


# ------------------------------------------------- 6. a conflicting tail is reached in one round trip
def test_a_follower_refusing_a_conflict_sends_the_leader_back_to_after_its_commit_index():
    """A follower whose entry at prevLogIdx is of another term answers "resume after my commit index" (every
    entry up to it is on the leader's log), not prevLogIdx: the leader's next AppendEntries then matches and
    cuts the conflicting tail at once, however long.  Found by the simulation (seed 700: one entry per
    heartbeat, and never below the round's first batch)."""
    with SimCluster(start=False) as c:
        n, obj, sent = _alone(c, vouched=True, term=3)
        peer = fake_peer(c, 2)
        index, log_term = _last(n)
        entries = [[b"x", index + i, 3] for i in range(1, 6)]
        deliver(n, peer, {"type": "append_entries", "term": 3, "commit_index": index, "prevLogIdx": index,
                           "prevLogTerm": log_term, "entries": entries})
        commit = n.on_loop(lambda: obj.commit_index)
        assert commit == index and _last(n) == (index + 5, 3)
        sent.clear()
        # The new leader (term 4) holds other entries after the commit index: its AppendEntries at the
        # follower's end conflicts.
        deliver(n, peer, {"type": "append_entries", "term": 4, "commit_index": index, "prevLogIdx": index + 5,
                           "prevLogTerm": 4, "entries": []})
        answers = _answers(sent, peer.address, "next_node_idx")
        assert answers[-1]["next_node_idx"] == commit + 1 and answers[-1]["refused"] is True
        assert not answers[-1]["success"]


def test_a_leader_takes_the_lowest_refusal_of_a_round_not_the_last():
    """The leader sends every batch from a follower's next index to its log's end in one round; the follower
    refuses each that does not match, the first with a low index (where the logs match), later ones with
    "beyond my log, resume at my end".  The next index follows the lowest refusal; an acknowledgement or a
    refusal of an earlier version (no "refused" field) sets it as pysyncobj does."""
    with SimCluster() as c:
        c.register(1)
        leader = c.leader()
        obj = leader.raft._obj
        follower = next(iter(obj.other_nodes))

        def refusals():
            term = obj.term
            obj.next_index[follower] = 50
            obj.on_message(follower, {"type": "next_node_idx", "next_node_idx": 7, "reset": True,
                                      "success": False, "term": term, "refused": True})
            low = obj.next_index[follower]
            obj.on_message(follower, {"type": "next_node_idx", "next_node_idx": 40, "reset": True,
                                      "success": False, "term": term, "refused": True})
            kept = obj.next_index[follower]
            obj.on_message(follower, {"type": "next_node_idx", "next_node_idx": 40, "reset": True,
                                      "success": False, "term": term})  # an earlier version's: taken as it is
            return low, kept, obj.next_index[follower]
        assert leader.on_loop(refusals) == (7, 7, 40)
