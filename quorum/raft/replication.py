"""Raft's rules as pidquorum runs them: what a node does with each message, when it campaigns, what
it commits, applies and compacts.

``Replicated`` is pysyncobj's Raft (``upstream.Core``) with each rule below in one method:

===========================================  =====================================================
rule                                         where
===========================================  =====================================================
who may send what (configuration, recovery)  ``on_message``
RequestVote from a lower term: answered      ``_stale_term``
with this node's term (a denial)
every vote request answered with the term    ``_deny`` (outside the configuration, held back,
                                             in a lease)
pre-vote before a campaign (thesis 9.6)      ``_election_due``, ``_on_pre_vote``,
                                             ``_on_pre_vote_response``
the campaign                                 ``_campaign``
check-quorum: a node that hears its leader   ``_in_lease``; the leader's own step-down is
takes no higher term from a vote request     pysyncobj's (``leader_step_down_timeout``)
a vote counted once per voter and term       ``_new_voter``
a held-back node's vote                      ``_may_vote``, ``_withhold``
acknowledgements carry their term; a         ``on_message`` (``next_node_idx``)
higher one deposes the leader
AppendEntries: term (a lower one answered    ``_append_entries``
with this node's), leader, election timer
log matching, cut at the first conflict      ``_match_and_append``
only, commit to what the message verified
acknowledgement, durable first; a held-back  ``_reply``
node's never counts
snapshot install                             ``_snapshot_chunk``, ``load_snapshot``
compaction                                   ``try_compaction``, ``members_at``
configuration: the latest in the log,        ``adopt_log_configuration``, ``_rollback_membership``
committed or not
commands only on the node they were          ``check_commands``
submitted to, while it leads
a lost leader noticed at once                ``on_node_disconnected``
a held-back node never campaigns             ``on_tick``
a committed membership entry: its commit     ``apply_log_entries``
index durable at once
===========================================  =====================================================
"""
from __future__ import annotations

import logging
import pickle
import queue
from typing import Any, Protocol

from snapshots.format import Snapshot, decode_snapshot
from snapshots.storage.disk import CorruptFileError

from ..linkcrypto import MessagePickle
from ..looppoller import LoopPoller
from .upstream import (CANDIDATE, FOLLOWER, LEADER, NOT_LEADER, REQUEST_DENIED, UNKNOWN_OUTCOME, Core, Node, clock,
                       jitter, replicated_method, unpickle)

class NodeSide(Protocol):
    """What the replication rules use of their node (``quorum.raft.node.RaftNode``): its files, its
    recovery state (held back until it has caught up), its identity checks and its loop."""
    journal: Any
    store: Any
    identity: Any
    recovery: Any
    vouched: bool
    restricted: bool
    quiet: int
    votes_withheld: int
    last_compaction: float

    def on_loop_thread(self) -> bool: ...

    def propose_now(self) -> None: ...

    def wake(self) -> None: ...

    def quiet_append(self) -> None: ...

    def votes_without_pre_vote(self, address: str) -> bool: ...

    def check_recovery(self) -> None: ...

    def diverged(self, index: int, term: int, held: Any) -> None: ...

    def compact(self, prev: Any, last: Any, cluster: list[str]) -> None: ...

    def install(self, snap: Snapshot, data: bytes) -> None: ...

    def _apply(self, index: int, payload: bytes) -> Any: ...

    def _restore_state(self, records: list, last_index: int) -> None: ...

log = logging.getLogger(__name__)

COMMIT_NOTIFY_S = 0.005  # a new commit index reaches the followers at most this late (see Replicated)
RECOVERED_VOTE = "<recovered: no vote this term>"  # votedFor after catching up (a vote there may be lost)


def configuration_before(members: list[str], changes: list[tuple[str, str]]) -> list[str]:
    """``members`` with ``changes`` (oldest first: ("add" | "rem", address)) undone, newest first: the
    configuration before them.  Undoing an add removes the address, undoing a removal puts it back."""
    members = list(members)
    for kind, address in reversed(changes):
        if kind == "add":
            members = [a for a in members if a != address]
        elif kind == "rem" and address not in members:
            members.append(address)
    return members


def is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


VOTE_REQUESTS = ("request_vote", "pq_pre_vote")


class PreVote:
    """A pre-vote round (``Replicated._election_due``): the term it asks about (this node's next) and who
    answered.  ``granted`` holds this node's own address from the start."""

    def __init__(self, term: int, own: str):
        self.term = term
        self.granted = {own}
        self.denied: set[str] = set()


class Replicated(Core):
    """pysyncobj's Raft with pidquorum's rules where pysyncobj's are unsafe (``upstream``'s table): what a
    node does with each message, when it campaigns, what it commits and applies, how it compacts."""

    def __init__(self, self_addr, partners, conf, transport_class, node: NodeSide, node_class=Node,
                 poller: LoopPoller | None = None):
        self._pq = node
        self._leader_heard = float("-inf")  # when this node last took an AppendEntries from its leader
        self._pre_vote: PreVote | None = None  # this node's pre-vote round under way
        self._pieces: tuple[tuple, bytearray] | None = None  # an entry in pieces: (leader, term, place), data
        super().__init__(self_addr, partners, conf, transport_class, node_class, poller)

    def apply_command(self, command, callback, command_type=None):
        """pysyncobj's, without its pipe when called on the loop that drives this node (from another
        thread, the pipe wakes the loop).  The command is queued; a leader then appends and sends it at
        once (``RaftNode.propose_now``), any other node at its tick in the loop's next pass."""
        if self._loop_poller is None or not self._pq.on_loop_thread():
            return super().apply_command(command, callback, command_type)
        if not self.queue_command(command, callback, command_type):
            return
        if self.state == LEADER and self.transport.ready:
            self._pq.propose_now()
        else:
            self._pq.wake()

    def propose_entry(self, payload: bytes, callback) -> None:
        """``apply_entry(payload)`` replicated: the command pysyncobj's ``@replicated`` wrapper makes (the
        method's number and its arguments, pickled), but pickled with protocol 4 (``MessagePickle``), where
        the wrapper's protocol 2 sends the payload's bytes through ``_codecs.encode``.  Every version
        unpickles either when it applies the entry (pysyncobj's ``pickle.loads``)."""
        command = MessagePickle.dumps((self.method_id("apply_entry"), (payload,)))
        self.apply_command(command, callback, self.REGULAR)

    @replicated_method
    def apply_entry(self, payload):
        # pysyncobj increments raftLastApplied after this returns, so the index
        # of the entry being applied is raftLastApplied + 1, on replay too.
        return self._pq._apply(self.last_applied + 1, bytes(payload))

    # ------------------------------------------------------------- the tick
    def apply_log_entries(self):
        """pysyncobj's apply, without its immediate AppendEntries after each commit.

        pysyncobj answers "send AppendEntries now" whenever it applied something, so every committed
        entry cost a second round of messages (an AppendEntries carrying only the new commit index to
        each follower, and each follower's acknowledgement: half of the messages of an entry, each
        pickled, compressed and encrypted).  The followers learn the commit index from the next
        entry's AppendEntries instead, or at the latest ``COMMIT_NOTIFY_S`` later: the next heartbeat is
        brought forward to then.  Only when followers apply changes (reads they serve: ACLs,
        transactions to complete); what the leader commits, applies and answers does not.
        """
        membership = self._commits_membership()
        applied = super().apply_log_entries()
        if membership:
            # The commit index that covers a membership entry durable now, not at the meta's next one-second
            # write: this node's word to a restarted peer says the configuration is committed here
            # (``RaftNode._config_word``), and that word is what lets the peer go without the word of a member
            # removed (``RaftNode._configurations``).  Reported uncommitted after a restart within the second,
            # it kept a copy from before a removal waiting for the removed member for good.
            self._pq.journal.onOneSecondTimer()
        if applied and self.state == LEADER:
            self.next_append_time = min(self.next_append_time, clock() + COMMIT_NOTIFY_S)
        return False

    def _commits_membership(self) -> bool:
        """A membership entry is among the committed entries about to be applied."""
        if not self.configuration.dynamicMembershipChange:
            return False
        journal = self._pq.journal
        for index in range(self.last_applied + 1, self.commit_index + 1):
            entry = journal.entry(index)
            if entry is not None and self.parse_membership(entry[0]) is not None:
                return True
        return False

    def on_node_disconnected(self, node):
        """The leader's connection closed: campaign within half the minimum election timeout, not the whole.

        A leader killed or crashed has its connections closed by its kernel at once; a live leader's
        connection closes only after ``connection_timeout`` without a byte, beyond any election timeout, so
        this adds no election where there would have been none.  The draw spreads the followers' campaigns
        (both see the same close), as the election timeout's does; a node held back never campaigns
        (``_onTick``).  Only when an election starts changes, never what a vote or a commit needs."""
        super().on_node_disconnected(node)
        if node == self.leader and self.state == FOLLOWER and not self.transfer_in_progress:
            soon = clock() + self.configuration.raftMinTimeout / 2 * jitter()
            self.election_deadline = min(self.election_deadline, soon)
            # Nor does the leader's lease hold any more (``_in_lease``): every follower sees the close, and
            # each grants the others' pre-votes and votes at once.
            self._leader_heard = float("-inf")

    def on_tick(self, time_to_wait: float) -> None:
        if self._pq.restricted:
            # A node that may have lost acknowledged entries never stands for election (nor asks for pre-votes).
            self.election_deadline = clock() + self.election_timeout()
        elif (self.state != LEADER and self.election_deadline < clock() and self.transport.ready
              and self.connected_to_anyone()):
            self._election_due()
        # pysyncobj's campaign in this tick never runs: the deadline is in the future now (see _campaign).
        super().on_tick(time_to_wait)

    # ------------------------------------------------------------- elections
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

    # ------------------------------------------------------ replaced: messages
    def check_commands(self):
        """pysyncobj's hand-over of submitted commands, without its forwarding to the leader.

        pysyncobj sends a command submitted on a node that is not the leader (any more) to the leader, which
        appends it.  Every command of pidquorum's is a batch of records a leader generated from its own
        applied state; on a node that lost its leadership that state may be stale.  Seed 510431 of the
        transaction simulation: a leader paused while it waited for its barrier entry resumed as a follower,
        generated a batch on its old state and proposed it; pysyncobj forwarded it and the new leader
        committed a second producer ID for a transactional id beside its open transaction (a snapshot
        taken after it could not be loaded).  Here a command is appended only by the node it was submitted
        to while that node leads; otherwise it is refused, a definite answer (it is in no log): the client
        retries, and the batch is generated again on the leader's state."""
        if self.state == LEADER:
            return super().check_commands()
        pending = self.commands_queue
        while True:
            try:
                _, callback = pending.get_nowait()
            except queue.Empty:
                return
            if isinstance(callback, tuple):  # a command another node forwarded (a node of an earlier version)
                node, request_id = callback
                self.transport.send(node, {"type": "apply_command_response", "request_id": request_id,
                                           "error": NOT_LEADER})
            elif callback is not None:
                callback(None, NOT_LEADER)

    def on_message(self, node, message):
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == "apply_command":
            # A command another node forwarded (only a node of an earlier version forwards): generated on
            # that node's state, which may be stale; refused (see _checkCommandsToApply).
            if "request_id" in message:
                self.transport.send(node, {"type": "apply_command_response", "request_id": message["request_id"],
                                           "error": REQUEST_DENIED})
            return
        if (kind != "append_entries" and node not in self.other_nodes
                and not (kind in VOTE_REQUESTS and self._pq.restricted and self._may_vote(message))):
            # Outside this node's configuration: only a leader's AppendEntries are taken (see Gate.dropNode),
            # and the vote a held-back node may give (_may_vote): a candidate that holds its target holds what
            # it waits for, and may be the only one (a member added since, whose entry is not in this node's
            # log yet, while the other members wait for its log too).  Raft servers vote for candidates outside
            # their configuration (thesis 4.1); other nodes keep out a removed member's campaigns, but answer
            # them with their term (a denial), as every vote request is answered.
            if kind in VOTE_REQUESTS:
                self._deny(node, message)
            return
        if kind == "append_entries":
            self._append_entries(node, message)
            return
        if kind == "pq_pre_vote":
            self._on_pre_vote(node, message)
            return
        if kind == "pq_pre_vote_response":
            self._on_pre_vote_response(node, message)
            return
        if kind in ("request_vote", "response_vote") and self._stale_term(node, message):
            return
        if kind == "request_vote" and is_int(message.get("term")) and message["term"] > self.term \
                and self._in_lease(message):
            return  # check-quorum: neither granted nor its term taken
        if kind in ("request_vote", "timeout_now") and self._pq.restricted and not self._may_vote(message):
            self._withhold(node, message)
            return
        if kind == "response_vote" and not self._new_voter(node, message):
            return
        if kind == "next_node_idx":
            term = message.get("term", self.term)
            if is_int(term) and term > self.term:
                # Raft: a response with a higher term deposes this node (pysyncobj only looks at the terms of
                # requests: a follower in a higher term that never campaigns, a recovering one, was never heard).
                self.set_term(term, None)
                self.step_down()
                return
            if term != self.term:
                return  # an acknowledgement from another term (delayed): it says nothing about this leader's log
            message = self._refusal(node, message)
        super().on_message(node, message)
        if (kind == "next_node_idx" and message.get("success") and self.state == LEADER):
            match = self.match_index.get(node)
            entry = self._pq.journal.entry(match) if match else None
            if entry is not None:
                self._pq.identity.note_held(node.address, (entry[2], entry[1]))
            if not message.get("reset") and self._commits_nothing():
                self._pq.quiet += 1

    def _refusal(self, node, message) -> dict:
        """A follower's refusal lowers the leader's next index for it, never raises it.  The leader sends every
        batch from the next index to its log's end in one round and the follower refuses each of them that
        does not match; pysyncobj took the last answer, so a later batch's ("beyond my log, resume at my
        end") undid the first one's (resume lower, where the logs match) and the leader never reached the
        follower's conflicting tail.  What moves the next index up is an acknowledgement (or the leader's
        own sending)."""
        if not (message.get("refused") is True and message.get("reset") and not message.get("success")
                and self.state == LEADER):
            return message
        proposed, current = message.get("next_node_idx"), self.next_index.get(node)
        if is_int(proposed) and is_int(current) and proposed > current:
            return dict(message, next_node_idx=current)
        return message

    def _commits_nothing(self) -> bool:
        """No follower holds an entry beyond the commit index and every committed entry is applied: a tick
        now would change nothing that the next timed tick would not (``RaftNode._on_ready``)."""
        commit = self.commit_index
        return (self.last_applied == commit
                and all(m <= commit for m in self.match_index.values()))

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

    def _append_entries(self, node, m) -> None:
        term, leader_commit = m.get("term"), m.get("commit_index")
        if not (is_int(term) and is_int(leader_commit)):
            log.warning("dropping a malformed AppendEntries from %s", node.address)
            return
        if term < self.term:
            # Answered with this node's term: the leader steps down (see next_node_idx above) and the next
            # election is in a term this node can follow.  A node held back never campaigns, and check-quorum
            # keeps a vote request from carrying a higher term to the others (_in_lease): nothing else would
            # ever tell this leader of the higher term this node holds (from a run before it stopped, a
            # transfer's campaign that failed).  A deposed leader learns it is one.
            self.transport.send(node, {
                "type": "next_node_idx", "next_node_idx": self._pq.journal.durable_end()[1] + 1,
                "reset": False, "success": False, "term": self.term})
            return
        # This node's leader in its term, as before the message: nothing about who leads changes.
        settled = (term == self.term and self.leader == node
                   and self.state == FOLLOWER)
        if term > self.term:
            self.transfer_in_progress = False  # a new leader supersedes any pending transfer
        if not self.transfer_in_progress:
            self.election_deadline = clock() + self.election_timeout()
        self._leader_heard = clock()
        if self.leader != node:
            self.leader_changed()
        self.leader = node
        if term > self.term:
            self.set_term(term, None)  # durable before anything below is acknowledged
        self.set_state(FOLLOWER)
        self.leader_commit_index = leader_commit
        if "prevLogIdx" in m:
            entries = m.get("entries", [])
            transmission = m.get("transmission")
            if transmission is not None:  # one entry too large for a message, in pieces
                whole = self._piece(node, term, m, transmission)
                if whole is None:
                    self.send_next_node_idx(node, success=False, reset=False)
                    return
                entries = [whole]
            steady = self._match_and_append(node, m.get("prevLogIdx"), m.get("prevLogTerm"), entries, leader_commit)
            if steady and settled:
                self._pq.quiet_append()
        elif m.get("serialized") is not None:
            self._snapshot_chunk(node, term, m["serialized"])
        # A message without entries and without a snapshot chunk verifies nothing: the commit
        # index does not move (pysyncobj advanced it here, over entries it never matched).

    def _piece(self, node, term: int, m: dict, transmission):
        """One piece of an entry sent in pieces; the entry once whole (``_transmitted_entry``), else None.

        The pieces of one entry share the leader, its term and the entry's place (prevLogIdx): a piece of
        another, or one without the start before it (lost, or a snapshot installed in between), starts
        nothing and is dropped with what was gathered (pysyncobj appended it to whatever its buffer held,
        a str at first: a TypeError that stopped the node; simulation seed 1491).  The leader sends the
        entry again from its start when the follower's answer moves its next index."""
        data, key = m.get("data"), (node.address, term, m.get("prevLogIdx"))
        if not isinstance(data, (bytes, bytearray)):
            log.warning("dropping a malformed piece of an entry from %s", node.address)
            self._pieces = None
            return None
        if transmission == "start":
            self._pieces = (key, bytearray(data))
            return None
        if transmission not in ("process", "finish") or self._pieces is None or self._pieces[0] != key:
            self._pieces = None
            return None
        self._pieces[1].extend(data)
        return self._transmitted_entry() if transmission == "finish" else None

    def _transmitted_entry(self):
        """The entry sent in pieces, if the pieces so far make it whole; else None (more pieces follow).

        pysyncobj's leader labels a piece "finish" when it reaches the length of the entry's command, not of
        the pickled entry, which is a few bytes longer: when a piece boundary falls between the two, the
        last two pieces both say "finish", and the first of them is a truncated pickle (simulation seeds 177
        and 332 with large records: the follower's tick failed unpickling it).  A truncated pickle never
        loads (it lacks its STOP opcode), so a "finish" that does not load is taken as one more piece."""
        try:
            entry = unpickle(bytes(self._pieces[1]))
        except (EOFError, ValueError, IndexError, KeyError, TypeError, AttributeError, pickle.UnpicklingError):
            return None
        self._pieces = None
        return entry

    def _match_and_append(self, node, prev_idx, prev_term, entries, leader_commit) -> bool:
        """Raft's AppendEntries on a follower.  True when it appended (or held) every entry, cut nothing,
        changed no membership and acknowledged them as counted: the steady state."""
        journal = self._pq.journal
        if not (is_int(prev_idx) and is_int(prev_term) and isinstance(entries, (list, tuple))
                and all(isinstance(e, (list, tuple)) and len(e) == 3 and is_int(e[1]) and is_int(e[2])
                        and e[1] == prev_idx + 1 + i for i, e in enumerate(entries))):
            log.warning("dropping a malformed AppendEntries from %s", node.address)
            return False
        last = journal.entries[-1][1]
        prev = journal.entry(prev_idx)
        if prev is None:  # beyond our log (or below its start): resume from our end
            self._reply(node, last + 1, verified=False, refused=True)
            return False
        if prev[2] != prev_term:
            # Resume after this node's commit index, not one entry lower: every entry up to it is on the leader's
            # log too (Raft's leader completeness), so the next AppendEntries matches and cuts this node's
            # conflicting tail at its first entry, however long the tail.  Walking back one entry per refusal
            # cost a round trip per entry, and with the leader's several batches a round, a later batch's
            # refusal ("beyond my log") put the leader's next index back up: the walk never got below the
            # round's first batch (simulation seed 700; transactions 288, 500000).
            self._reply(node, min(prev_idx, self.commit_index + 1), verified=False, refused=True)
            return False
        # Raft 5.3: skip what we hold; cut only at the first entry that conflicts.
        new, steady = [], True
        for i, e in enumerate(entries):
            held = journal.entry(e[1])
            if held is None:
                new = entries[i:]
                break
            if held[2] != e[2]:
                if e[1] <= self.commit_index:
                    self._pq.diverged(e[1], e[2], held)
                self._rollback_membership(e[1])
                dropped = journal.truncate_from(e[1])
                log.info("AppendEntries from %s conflicts at index %d (term %d here, %d from the leader): "
                         "cut %d uncommitted entries", node.address, e[1], held[2], e[2], dropped)
                new, steady = entries[i:], False
                break
        dynamic = self.configuration.dynamicMembershipChange
        for command, idx, eterm in new:
            command = bytes(command)
            journal.add(command, idx, eterm)
            if dynamic:
                change = self.parse_membership(command)
                if change is not None:
                    self.change_membership(change)
                    steady = False
        verified = entries[-1][1] if entries else prev_idx
        commit = min(leader_commit, verified)
        if commit > self.commit_index:
            self.commit_index = commit
            journal.setRaftCommitIndex(commit)  # syncs first
        return self._reply(node, verified + 1, verified=True) and steady

    def _rollback_membership(self, from_index: int) -> None:
        if not self.configuration.dynamicMembershipChange:
            return
        journal = self._pq.journal
        for entry in reversed([e for e in journal.entries if e[1] >= from_index]):
            change = self.parse_membership(entry[0])
            if change is not None:
                self.change_membership(change, reverse=True)

    def _reply(self, node, next_index: int, verified: bool, refused: bool = False) -> bool:
        """Acknowledge up to ``next_index - 1`` (durable first), or ask the leader to resume there.
        A recovering node's acknowledgements are sent as the latter: they move the leader's send
        position but never count toward a majority.  ``refused``: the message did not match this node's
        log, and the leader must send from no later than ``next_index`` (``_refusal``).  True when the
        acknowledgement counts."""
        self._pq.journal.sync()
        self._pq.check_recovery()
        counted = verified and not self._pq.restricted
        # pysyncobj's acknowledgement, plus the term it answers (the leader ignores any other term's).
        answer = {"type": "next_node_idx", "next_node_idx": next_index, "reset": not counted, "success": counted,
                  "term": self.term}
        if refused:
            answer["refused"] = True  # an earlier version ignores the field
        self.transport.send(node, answer)
        return counted

    def _snapshot_chunk(self, node, term: int, serialized) -> None:
        pq = self._pq
        try:
            data, is_first, is_last = serialized
        except (TypeError, ValueError):
            log.warning("dropping a malformed snapshot chunk from %s", node.address)
            return
        whole = pq.store.receive((node.address, term), data, bool(is_first), bool(is_last))
        if whole is None:
            return
        try:
            snap = decode_snapshot(f"snapshot from {node.address}", whole)  # verified before anything is written
        except CorruptFileError as e:
            log.error("refusing a snapshot from %s: %s", node.address, e)
            return
        commit = self.commit_index
        if snap.last_index <= commit:  # we hold everything it covers: resume after our commit index
            self._reply(node, commit + 1, verified=False)
            return
        pq.install(snap, whole)
        self.load_snapshot(snap)
        self._reply(node, snap.last_index + 1, verified=True)

    # --------------------------------------------------- replaced: snapshots
    def load_snapshot(self, snap: Snapshot) -> None:
        """Make ``snap`` the applied state (at start, and after an install)."""
        last = snap.last_index
        self._pq._restore_state(snap.records, last)
        self.last_applied = last
        if self.commit_index < last:
            self.commit_index = last
            self._pq.journal.setRaftCommitIndex(last)
        waiting = self.waiting_commit
        for idx in sorted(i for i in waiting if i <= last):
            for _term, callback in waiting.pop(idx):
                callback(None, UNKNOWN_OUTCOME)  # overtaken by the snapshot: outcome unknown
        if self.configuration.dynamicMembershipChange:
            me = self.self_node.address
            node_class = self.node_class
            self.set_configuration([node_class(a) for a in snap.cluster if a != me])
        self.set_code_version(0)
        self.need_load_dump = False

    def adopt_log_configuration(self, after_index: int) -> int:
        """At start: apply the membership changes in the journal after ``after_index`` (the snapshot).

        Raft: a server uses the latest configuration in its log, committed or not, and pysyncobj does so
        for entries it appends.  But on a restart it rebuilds membership from the snapshot and then only
        from entries as they are committed, and the durable commit index is a hint written once a second:
        a restarted node did not know members added just before it stopped, could not connect to them,
        and so could not hear a leader or a verdict from them.  Applying a change twice is a no-op
        (pysyncobj re-applies committed ones).  Returns how many changes were applied."""
        if not self.configuration.dynamicMembershipChange:
            return 0
        applied = 0
        for command, index, _term in list(self._pq.journal.entries):
            if index <= after_index:
                continue
            change = self.parse_membership(command)
            if change is not None and self.change_membership(change):
                applied += 1
        return applied

    def try_compaction(self):
        pq = self._pq
        conf = self.configuration
        now = clock()
        if (not self.force_compaction and len(pq.journal) <= conf.logCompactionMinEntries
                and now - pq.last_compaction <= conf.logCompactionMinTime):
            return
        self.force_compaction = False
        pq.last_compaction = now
        applied = self.last_applied
        prev, last = pq.journal.entry(applied - 1), pq.journal.entry(applied)
        current = pq.store.current
        if prev is None or last is None or (current is not None and current.last_index >= applied):
            return
        pq.compact(prev, last, self.members_at(applied))

    def members_at(self, index: int) -> list[str]:
        """The configuration as of log entry ``index``: the current one (the latest in the log, as Raft and
        pysyncobj use it) with the changes after ``index`` undone, newest first.

        A snapshot at ``index`` must record this one, not the current one.  It recorded the current one:
        with an uncommitted change after ``index`` (one removing the leader, say), a restart loaded a
        configuration that never held.  When the leader then cut that change, only the change was undone,
        not the snapshot's copy of it: the node knew no leader, could not hear it, and stayed behind for
        good (simulation seed 400136).  A snapshot sent to a follower carried the same error to it."""
        members = [self.self_node.address] + [n.address for n in self.other_nodes]
        if not self.configuration.dynamicMembershipChange:
            return members
        later = []
        for command, entry_index, _term in reversed(self._pq.journal.entries):
            if entry_index <= index:
                break
            change = self.parse_membership(command)
            if change is not None:
                later.append((change[0], str(change[1])))  # (kind, the node's id: its address)
        return configuration_before(members, later[::-1])

    def config_index(self) -> int:
        """The log index of this node's configuration: its latest membership entry, else the first index of
        its journal (the configuration its snapshot recorded, or the one it was started with)."""
        entries = self._pq.journal.entries
        for command, entry_index, _term in reversed(entries):
            if self.parse_membership(command) is not None:
                return entry_index
        return entries[0][1] if entries else 0

    # ------------------------------------------------------------ recovery
    def step_down(self) -> None:
        if self.state != FOLLOWER:
            self.set_state(FOLLOWER)
            self.leader = None

    def forget_match(self, node) -> None:
        """``node`` restarted: what it acknowledged before may be gone; count only new acknowledgements."""
        if node in self.match_index:
            self.match_index[node] = 0

    def no_vote_this_term(self) -> None:
        if self.voted_for is None:
            self.set_term(self.term, RECOVERED_VOTE)

    def current_term(self) -> int:
        return self.term

    def vouched_term(self, term: int) -> None:
        """The vouchers' highest term: this node may have voted in it (or below) in a run whose record
        it lost, so it casts no vote up to that term (durable before anything else)."""
        if term > self.term:
            self.set_term(term, RECOVERED_VOTE)
            self.step_down()
        else:
            self.no_vote_this_term()

