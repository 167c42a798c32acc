"""Raft's elections as pidquorum runs them: pre-vote, the campaign, check-quorum's lease, and the
answers to vote requests (terms, denials, a vote counted once per voter, a held-back node's vote).
Mixed into ``replication.Replicated`` (pysyncobj's Raft), whose state it shares."""
from __future__ import annotations

import logging

from .fields import is_int
from .nodeside import NodeSide
from .upstream import CANDIDATE, FOLLOWER, LEADER, clock

log = logging.getLogger(__package__ + ".replication")  # the rules' log lines keep their logger's name

VOTE_REQUESTS = ("request_vote", "pq_pre_vote")


class PreVote:
    """A pre-vote round (``Replicated._election_due``): the term it asks about (this node's next) and who
    answered.  ``granted`` holds this node's own address from the start."""

    def __init__(self, term: int, own: str):
        self.term = term
        self.granted = {own}
        self.denied: set[str] = set()



class Elections:
    """When a node campaigns and what it answers a candidate.  ``Replicated.__init__`` sets the state below."""

    _pq: NodeSide
    _pre_vote: PreVote | None  # this node's pre-vote round under way
    _leader_heard: float  # when this node last took an AppendEntries from its leader

    def _election_due(self) -> None:
        """The election timer fired: a pre-vote round first (Raft thesis 9.6, etcd's PreVote), a campaign only
        once a majority, this node included, said it would vote for it in its next term.

        A node cut off from the others (a partition, a slow link) asks and hears no majority: its term stays,
        and when it comes back it does not depose a leader the others still follow (which check-quorum's
        lease refuses anyway, ``_in_lease``).  A leadership transfer campaigns at once, its vote requests
        marked as such (the leader asked for it).

        A peer of an earlier version ignores ``pq_pre_vote`` (an unknown type) and would never answer.  Its
        hello says what it is (a node of this version sends ``pre_vote`` in its hello): a member whose hello
        came without it is counted as granted at once, as it votes as it always did; the real vote is still
        its own.  So a rolling upgrade never stalls an election, and a mixed cluster is as before the upgrade
        for its older members (a member never heard from counts as nothing)."""
        if self.transfer_in_progress:
            self._campaign(transfer=True)
            return
        round_ = self._pre_vote = PreVote(self.term + 1, self.self_node.address)
        self.election_deadline = clock() + self.election_timeout()
        index, term = self.last_log()
        ask = {"type": "pq_pre_vote", "term": self.term + 1, "last_log_index": index, "last_log_term": term}
        for node in self.other_nodes:
            if self._pq.votes_without_pre_vote(node.address):
                round_.granted.add(node.address)
            else:
                self.transport.send(node, ask)
        if len(round_.granted) > (len(self.other_nodes) + 1) / 2:
            self._campaign(transfer=False)

    def _campaign(self, transfer: bool) -> None:
        """Raft's campaign (pysyncobj's, from its ``_onTick``): the next term, a vote for itself, durable
        before its vote requests leave (the gate); a leadership transfer's requests say so (``_in_lease``)."""
        self._pre_vote = None
        self.election_deadline = clock() + self.election_timeout()
        self.transfer_in_progress = False
        self.leader = None
        self.set_state(CANDIDATE)
        self.set_term(self.term + 1, self.self_node.id)
        self.votes_count = 1
        index, term = self.last_log()
        ask = {"type": "request_vote", "term": self.term, "last_log_index": index, "last_log_term": term}
        if transfer:
            ask["transfer"] = True  # an earlier version ignores the field
        for node in self.other_nodes:
            self.transport.send(node, ask)
        self.leader_changed()
        if self.votes_count > (len(self.other_nodes) + 1) / 2:
            self.become_leader()

    def _in_lease(self, message) -> bool:
        """Check-quorum's other half (KIP-996, Raft thesis 9.6): a node that heard from a current leader within
        the minimum election timeout, or leads itself, neither grants a vote nor takes a higher term from a
        vote request, unless the leader asked for the campaign (a transfer).  A node that returns from a
        partition with a higher term does not depose a leader the others follow; a leader that lost its
        majority steps down by itself (pysyncobj's ``leaderFallbackTimeout``, ``leader_step_down_timeout``)."""
        if message.get("type") == "request_vote" and message.get("transfer") is True:
            return False
        if self.state == LEADER:
            return True
        return (self.leader is not None
                and clock() - self._leader_heard < self.configuration.raftMinTimeout)

    def _deny(self, node, message) -> None:
        """A vote or pre-vote request answered no, with this node's term: a candidate below it follows it.

        A RequestVote is answered only from a lower term than this node's, where the answer tells the
        candidate something.  A denial in the candidate's own term would count as a vote on a node of an
        earlier version (pysyncobj counts every ``response_vote`` of its term); one from a lower term it
        ignores.  A pre-vote (a type of this version) is always answered."""
        term = message.get("term")
        if message.get("type") == "pq_pre_vote":
            self.transport.send(node, {"type": "pq_pre_vote_response", "term": self.term, "pre_term": term,
                                       "granted": False})
        elif is_int(term) and term < self.term:
            self.transport.send(node, {"type": "response_vote", "term": self.term, "granted": False})

    def _on_pre_vote(self, node, message) -> None:
        """Would this node vote for the sender in the sender's next term?  Yes if that term is above this
        node's, the sender's log is at least as up-to-date as this one's (Raft 5.4.1), this node is not held
        back (but see ``_may_vote``) and hears no leader (``_in_lease``).  Nothing of this node changes."""
        term = message.get("term")
        last = (message.get("last_log_term"), message.get("last_log_index"))
        if not (is_int(term) and all(is_int(x) for x in last)):
            log.warning("dropping a malformed pre-vote from %s", node.address)
            return
        index, own_term = self.last_log()
        granted = (term > self.term and last >= (own_term, index) and not self._in_lease(message)
                   and (not self._pq.restricted or self._may_vote(message)))
        self.transport.send(node, {"type": "pq_pre_vote_response", "term": self.term, "pre_term": term,
                                   "granted": granted})

    def _on_pre_vote_response(self, node, message) -> None:
        """An answer to this node's pre-vote: a denial from a higher term makes this node a follower in it
        (the answer carries the voter's term, as a vote's does); a majority of grants starts the campaign."""
        term, granted = message.get("term"), message.get("granted") is True
        if not is_int(term):
            return
        if term > self.term and not granted:
            self._pre_vote = None
            self.set_term(term, None)
            self.step_down()
            return
        round_ = self._pre_vote
        if (round_ is None or message.get("pre_term") != round_.term or round_.term != self.term + 1
                or self.state == LEADER or self._pq.restricted):
            return
        (round_.granted if granted else round_.denied).add(node.address)
        if len(round_.granted) > (len(self.other_nodes) + 1) / 2:
            self._campaign(transfer=False)

    def _stale_term(self, node, message) -> bool:
        """Raft's terms on votes, which pysyncobj leaves out: a RequestVote from an earlier term is answered
        with this node's term (pysyncobj dropped it in silence), and such an answer makes the candidate a
        follower in that term.  Without it a candidate that missed a term (one that hears from nobody else
        in it: a view of the membership without the others) campaigned below the others' term forever,
        while they could elect nobody without it (found by the simulation, seed 102068).  A denial is a
        ``response_vote`` with ``granted`` false: an older node counts votes of its own term only, so it
        ignores one."""
        term, current = message.get("term"), self.term
        if not is_int(term):
            return False
        if message.get("type") == "request_vote":
            if term >= current:
                return False
            self.transport.send(node, {"type": "response_vote", "term": current, "granted": False})
            return True
        if term > current:
            self.set_term(term, None)
            self.step_down()
            return True
        return message.get("granted") is False

    def _new_voter(self, node, message) -> bool:
        """pysyncobj counts vote messages, not voters: a vote delivered twice would count twice (two
        leaders in one term).  Count each voter once per term."""
        term = self.term
        if getattr(self, "_voters_term", None) != term:
            self._voters_term, self._voters = term, set()
        if node.address in self._voters:
            return False
        if message.get("term") == term:
            self._voters.add(node.address)
        return True

    def _may_vote(self, message) -> bool:
        """A vouched node still catching up may vote for a candidate whose log reaches its recovery
        target: that candidate holds every committed entry this node may have lost.  No leadership
        transfer to it, and no vote at all before the peers vouched for it."""
        pq = self._pq
        if message.get("type") not in VOTE_REQUESTS or not pq.vouched or pq.recovery is None:
            return False
        last = (message.get("last_log_term"), message.get("last_log_index"))
        return all(is_int(x) for x in last) and last >= pq.recovery

    def _withhold(self, node, message) -> None:
        """A recovering node keeps up with terms but grants no vote and takes no leadership (a vote request
        from a lower term is answered with its term: ``_stale_term``, ``_deny``)."""
        term = message.get("term")
        if is_int(term) and term > self.term:
            self.set_term(term, None)
            self.set_state(FOLLOWER)
            self.leader = None
        self._pq.votes_withheld += 1
