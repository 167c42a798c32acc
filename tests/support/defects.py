"""Switches that put back the defects the storage/replication work removed (test-only code).

Each is a context manager that patches production code from the outside, for the length of
the block; nothing in a production module reads a switch.  They exist to prove that the
deterministic simulation and the crash-state explorer *can fail*: with a switch on, they must
find a violation (tests/chaos/test_simulation.py).  Worker processes forked inside the block
inherit the patch.
"""
from __future__ import annotations

import contextlib

import quorum.raft.files as raft_files
import quorum.raft.node as raft_node
from broker import txn_coordinator
from broker.pid_manager import ProducerIdManager
from quorum.identity import NodeIdentity, Verdict
from quorum.journal import DurableJournal
from quorum.managers import ProducerIdsManager
from quorum.raft.replication import Replicated
from records import ProducerIdSeedRecord
from snapshots.store import SnapshotStore


@contextlib.contextmanager
def _patched(*triples):
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in triples]
    try:
        for obj, name, value in triples:
            setattr(obj, name, value)
        yield
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)


def journal_cleared_on_mismatch():
    """Defect 1: a start that finds a journal not beginning with the snapshot's two entries clears it
    (pysyncobj's ``__loadDumpFile``) instead of finishing the interrupted compaction."""
    original = raft_files.reconcile

    def reconcile(journal, snap, journal_path, snapshot_path):
        if snap is not None and journal.entries and not (
                len(journal.entries) >= 2 and journal.entries[0][1:] == snap.prev_entry[1:]
                and journal.entries[1][1:] == snap.last_entry[1:]):
            journal._write_whole([tuple(snap.prev_entry), tuple(snap.last_entry)])
            return "cleared the journal (defect switch)"
        return original(journal, snap, journal_path, snapshot_path)
    return _patched((raft_files, "reconcile", reconcile))


class _WithoutSyncs:
    """An ``os``-like object whose fsync and fdatasync do nothing (every other call goes to ``os_module``)."""

    def __init__(self, os_module):
        self._os = os_module

    def __getattr__(self, name):
        return getattr(self._os, name)

    def fsync(self, fd):
        pass

    fdatasync = fsync


def install_not_synced():
    """Defect 2: a follower writes and renames an installed snapshot with no fsync of the file or the
    directory (pysyncobj's ``setTransmissionData``); the journal is rebased and the install
    acknowledged all the same.  The production ``Disk.write_file`` runs with its syncs doing nothing."""
    original = SnapshotStore.install

    def install(self, data):
        disk = self.disk
        real = disk.os
        disk.os = _WithoutSyncs(real)
        try:
            return original(self, data)
        finally:
            disk.os = real
    return _patched((SnapshotStore, "install", install))


def failed_sync_ignored():
    """Defect 3: bytes count as synced before fdatasync returns, and an error is caught and forgotten
    (pysyncobj's tick logged it and went on); acknowledgements leave with nothing on disk."""
    def sync(self):
        if self._durable == len(self.entries) and not self._pending:
            return
        pending, self._pending = self._pending, bytearray()
        self._durable = len(self.entries)
        try:
            if pending:
                self._file.write(pending)
            self._file.sync()
        except BaseException:  # noqa: BLE001 - the defect: the error is swallowed
            pass
    return _patched((DurableJournal, "sync", sync))


def restored_backup_accepted():
    """Defect 4: a node that lost what it acknowledged is let in as a full member: peers never hand out
    a recovery target, a restart needs no peer's word, and the node's own evidence is ignored."""
    original = NodeIdentity.admit

    def admit(self, address, hello, record=True):
        v = original(self, address, hello, record)
        return Verdict(refused=v.refused, recover=None, new_run=v.new_run)

    def check_vouched(self):
        self.vouched = True
    return _patched((NodeIdentity, "admit", admit), (raft_node, "loss_evidence", lambda *a: []),
                    (raft_node.RaftNode, "check_vouched", check_vouched))


def commit_from_unverified_message():
    """Defect 5: an AppendEntries carrying a snapshot chunk (or ``serialized=None``) moves the follower's
    commit index to the leader's, over entries it never matched."""
    original = Replicated._append_entries

    def append_entries(self, node, m):
        original(self, node, m)
        if "prevLogIdx" not in m and isinstance(m.get("commit_index"), int) and m.get("term", -1) >= self.term:
            commit = min(m["commit_index"], self._pq.journal.entries[-1][1])
            if commit > self.commit_index:
                self.commit_index = commit
                self._pq.journal.setRaftCommitIndex(commit)
    return _patched((Replicated, "_append_entries", append_entries))


def truncate_after_prev_index():
    """Defect 6: the follower cuts its log after every AppendEntries' prevLogIdx whenever it holds entries
    after it, even where they match and even for a heartbeat without entries (pysyncobj; Raft 5.3: only
    at the first conflict), and clamps its commit index to what is left."""
    original = Replicated._match_and_append

    def match_and_append(self, node, prev_idx, prev_term, entries, leader_commit):
        journal = self._pq.journal
        prev = journal.entry(prev_idx) if isinstance(prev_idx, int) else None
        if prev is not None and prev[2] == prev_term and journal.entries[-1][1] > prev_idx:
            journal.truncate_from(prev_idx + 1)
            if self.commit_index > prev_idx:
                self.commit_index = prev_idx
        original(self, node, prev_idx, prev_term, entries, leader_commit)
    return _patched((Replicated, "_match_and_append", match_and_append))


def kafka_15552_seed_at_block_start():
    """KAFKA-15552: the migration seeds the quorum with the ZooKeeper block's start instead of
    block_end + 1, so the quorum issues that block again."""
    original = ProducerIdsManager.generate_seed

    def generate_seed(self, next_producer_id, origin, zk_broker, zk_block_start, zk_block_end, now_ms):
        result = original(self, next_producer_id, origin, zk_broker, zk_block_start, zk_block_end, now_ms)
        result.records[:] = [ProducerIdSeedRecord(next_producer_id=zk_block_start, origin=r.origin,
                                                  zk_broker=r.zk_broker, zk_block_start=r.zk_block_start,
                                                  zk_block_end=r.zk_block_end, timestamp_ms=r.timestamp_ms)
                             if isinstance(r, ProducerIdSeedRecord) else r for r in result.records]
        return result
    return _patched((ProducerIdsManager, "generate_seed", generate_seed))


def kafka_20031_less_than_for_at_most():
    """KAFKA-20031: the broker's check of a returned block used ``<`` where ``<=`` belongs, so a block
    starting at the last ID it already held was accepted and that ID handed out twice."""
    original = ProducerIdManager._validate

    def validate(self, start, length):
        problem = original(self, start, length)
        last = self._last_accepted_end
        if problem is not None and last is not None and start == last - 1 and problem.startswith("start is at"):
            return None
        return problem
    return _patched((ProducerIdManager, "_validate", validate))


def txn_step_names_no_transaction():
    """The late-step defect (before transaction sequences): every step a coordinator sends names "the id's
    current transaction, whichever it is" (sequence -1), so a step that reaches the quorum late or twice (a
    paused node forwarding its queued copy after the client went on, a duplicated request) is applied to
    the producer's next transaction: a commit prepared that its client never asked for."""
    return _patched((txn_coordinator._Known, "names", lambda self, op: -1))


def vote_denial_term_ignored():
    """Liveness: a candidate ignores a vote denial and the term it carries, as if the voter had said nothing
    (pysyncobj sends no answer to a RequestVote from an earlier term).  A candidate below the others' term
    then stays there while they, held back or with a shorter log, elect nobody without it.  Patches the two
    places where a denial's higher term makes the candidate a follower in it: ``Replicated._stale_term``
    (a ``response_vote`` with ``granted`` false: dropped before it is read) and
    ``Replicated._on_pre_vote_response`` (a ``pq_pre_vote_response`` not granted: handed on without its
    term, which drops it too)."""
    original = Replicated._stale_term

    def stale_term(self, node, message):
        if message.get("type") == "response_vote" and message.get("granted") is False:
            return True
        return original(self, node, message)
    pre_vote_response = Replicated._on_pre_vote_response

    def on_pre_vote_response(self, node, message):
        if message.get("granted") is not True:
            message = {k: v for k, v in message.items() if k != "term"}
        return pre_vote_response(self, node, message)
    return _patched((Replicated, "_stale_term", stale_term),
                    (Replicated, "_on_pre_vote_response", on_pre_vote_response))


def commit_past_verified():
    """Blind spot 1: a follower moves its commit index to the leader's, capped by the end of its own log
    instead of by the last entry the AppendEntries verified (Raft, figure 2: min(leaderCommit, index of
    last new entry)).  A follower holding a deposed leader's uncommitted tail beyond what a split batch
    carried would then apply that tail.  With the leader walking back its next index one entry per refusal,
    the defect is unreachable: the first AppendEntries a follower matches starts at its first conflicting
    entry, which cuts the tail.  A walk that jumps back further (to the follower's commit index, say) makes it
    reachable by the split batches the seeds send."""
    original = Replicated._match_and_append

    def match_and_append(self, node, prev_idx, prev_term, entries, leader_commit):
        journal = self._pq.journal
        prev = journal.entry(prev_idx) if isinstance(prev_idx, int) else None
        matched = prev is not None and prev[2] == prev_term
        result = original(self, node, prev_idx, prev_term, entries, leader_commit)
        if matched and isinstance(leader_commit, int) and journal.entries:
            commit = min(leader_commit, journal.entries[-1][1])
            if commit > self.commit_index:
                self.commit_index = commit
                journal.setRaftCommitIndex(commit)
        return result
    return _patched((Replicated, "_match_and_append", match_and_append))


def install_keeps_conflicting_tail():
    """Blind spot 2: a follower installing a snapshot keeps the entries after the snapshot's last index
    even when its log holds that index in another term (Raft: keep what follows only when the entry
    there matches; otherwise the whole log goes).  The journal is rebased with that tail."""
    original = DurableJournal.rebase

    def rebase(self, prev, last):
        held = self.entry(last[1])
        if held is not None and held[2] != last[2]:
            tail = [e for e in self.entries if e[1] > last[1]]
            self._write_whole([tuple(prev), tuple(last)] + tail)
            return 0
        return original(self, prev, last)
    return _patched((DurableJournal, "rebase", rebase))


def term_and_vote_written_lazily():
    """Blind spot 3: the journal records a new term and vote in memory only, for its one-second timer (or
    its next metadata write) to store, as it does the commit index: a vote or an acknowledgement in that
    term leaves before the term is durable, and a restart forgets both."""
    def set_current_term(self, term, voted_for):
        self._meta["term"] = term
        self._meta["voted_for"] = voted_for
        self._meta_dirty = True
    return _patched((DurableJournal, "setCurrentTerm", set_current_term))


SWITCHES = {
    "journal-cleared-on-mismatch": journal_cleared_on_mismatch,
    "install-not-synced": install_not_synced,
    "failed-sync-ignored": failed_sync_ignored,
    "restored-backup-accepted": restored_backup_accepted,
    "commit-from-unverified-message": commit_from_unverified_message,
    "truncate-after-prev-index": truncate_after_prev_index,
    "kafka-15552-seed-at-block-start": kafka_15552_seed_at_block_start,
    "kafka-20031-less-than-for-at-most": kafka_20031_less_than_for_at_most,
    "txn-step-names-no-transaction": txn_step_names_no_transaction,
    "vote-denial-term-ignored": vote_denial_term_ignored,
    "commit-past-verified": commit_past_verified,
    "install-keeps-conflicting-tail": install_keeps_conflicting_tail,
    "term-and-vote-written-lazily": term_and_vote_written_lazily,
}
