"""Raft's rules as pidquorum runs them: what a node does with each message, when it campaigns, what it
commits, applies and compacts.  ``Replicated`` is pysyncobj's Raft (``upstream.Core``) with each rule in
one method, the elections mixed in from ``elections``, a follower's AppendEntries from ``following``;
``docs/durability.md`` ("Where each rule lives") indexes them.
"""
from __future__ import annotations

import logging
import queue

from snapshots.format import Snapshot

from ..linkcrypto import MessagePickle
from ..looppoller import LoopPoller
from .elections import VOTE_REQUESTS, Elections, PreVote
from .fields import is_int
from .following import Following
from .nodeside import NodeSide
from .upstream import (FOLLOWER, LEADER, NOT_LEADER, REQUEST_DENIED, UNKNOWN_OUTCOME, Core, Node, clock, jitter,
                       replicated_method)

__all__ = ["COMMIT_NOTIFY_S", "RECOVERED_VOTE", "NodeSide", "PreVote", "Replicated", "VOTE_REQUESTS",
           "configuration_before", "is_int"]

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


class Replicated(Elections, Following, Core):
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

