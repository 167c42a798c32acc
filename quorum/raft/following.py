"""Raft's AppendEntries on a follower as pidquorum runs it: the term and leader checks, an entry sent
in pieces, log matching cut at the first conflict only, the acknowledgement (durable first), and a
snapshot installed from the leader.  Mixed into ``replication.Replicated`` (pysyncobj's Raft), whose
state it shares."""
from __future__ import annotations

import logging
import pickle

from snapshots.format import decode_snapshot
from snapshots.storage.disk import CorruptFileError

from .fields import is_int
from .nodeside import NodeSide
from .upstream import FOLLOWER, clock, unpickle

log = logging.getLogger(__package__ + ".replication")  # the rules' log lines keep their logger's name


class Following:
    """What a follower does with its leader's messages.  ``Replicated.__init__`` sets the state below."""

    _pq: NodeSide
    _pieces: tuple[tuple, bytearray] | None  # an entry in pieces: (leader, term, place), data
    _leader_heard: float  # when this node last took an AppendEntries from its leader

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
