"""The one module that adapts pysyncobj (in the manner of Patroni's ``dcs/raft.py``).

Nothing else in pidquorum imports pysyncobj or sees its callbacks, FAIL_REASON
values or configuration names.  What this module adds to pysyncobj:

* one replicated entry point, ``apply_entry(payload)``, that applies an encoded
  batch of records (the on-disk format is then not tied to Python method names);
* durability: ``DurableJournal`` replaces pysyncobj's unsynced mmap journal
  (through pysyncobj's journal factory, the only hook it has), and the
  transport syncs that journal before any message leaves the node (the
  leader's AppendEntries: right after, in parallel with its followers);
* snapshots as records (``snapshots.format``) instead of pickles;
* fast failover: short election timeouts and peer pings that keep
  follower-to-follower links alive (pysyncobj leaves them idle, so the first
  RequestVote after a leader dies often finds a dead link: ~1.7 s elections);
* typed outcomes: ``ProposalRejected`` (definitely not applied) versus
  ``ProposalUnknown`` (may have been applied).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import pysyncobj.syncobj as _syncobj_module
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated
from pysyncobj.node import TCPNode
from pysyncobj.transport import TCPTransport

from snapshots.format import Snapshot, read_snapshot, write_snapshot

from .identity import EXIT_IDENTITY_REFUSED, Hello, NodeIdentity
from .journal import DurableJournal

log = logging.getLogger(__name__)

EXIT_CORRUPT_SNAPSHOT = 70


@dataclass
class RaftConfig:
    """Raft timing, in seconds, snake_case; mapped to pysyncobj's names in ``to_conf`` only."""

    heartbeat_interval: float = 0.05
    election_timeout_min: float = 0.25
    election_timeout_max: float = 0.5
    connection_timeout: float = 1.0
    reconnect_interval: float = 0.1
    peer_ping_interval: float = 0.15
    leader_step_down_timeout: float = 1.0
    compaction_min_entries: int = 5000
    compaction_min_time: float = 300.0

    def validate(self) -> None:
        problems = []
        if self.heartbeat_interval <= 0:
            problems.append("heartbeat_interval must be positive")
        if self.election_timeout_min <= 3 * self.heartbeat_interval:
            problems.append(f"election_timeout_min ({self.election_timeout_min}) must exceed 3 x "
                            f"heartbeat_interval ({self.heartbeat_interval})")
        if self.election_timeout_max <= self.election_timeout_min:
            problems.append("election_timeout_max must exceed election_timeout_min")
        if self.connection_timeout < self.election_timeout_max:
            problems.append("connection_timeout must be at least election_timeout_max")
        if self.peer_ping_interval >= self.connection_timeout / 2:
            problems.append("peer_ping_interval must be under half of connection_timeout")
        if self.leader_step_down_timeout <= self.heartbeat_interval:
            problems.append("leader_step_down_timeout must exceed heartbeat_interval")
        if self.compaction_min_entries < 2:
            problems.append("compaction_min_entries must be at least 2")
        if problems:
            raise ValueError("raft config: " + "; ".join(problems))


class ProposalRejected(Exception):
    """The entry was definitely not applied (not leader, queue full, ...): safe to retry."""


class ProposalUnknown(Exception):
    """The entry may or may not be applied (leader change, timeout): never reuse its values."""


_DEFINITE = {FAIL_REASON.QUEUE_FULL: "queue full", FAIL_REASON.MISSING_LEADER: "no leader",
             FAIL_REASON.DISCARDED: "discarded by a new leader", FAIL_REASON.NOT_LEADER: "not the leader",
             FAIL_REASON.REQUEST_DENIED: "request denied"}

# ---------------------------------------------------------------------------
# The journal hook.  SyncObj.__init__ calls the module-level createJournal of
# pysyncobj.syncobj; we route our journal paths to the DurableJournal the
# adapter built, and leave any other use of pysyncobj untouched.
_pending_journals: dict[str, DurableJournal] = {}
_pending_lock = threading.Lock()
_original_create_journal = _syncobj_module.createJournal


def _create_journal(path=None):
    with _pending_lock:
        journal = _pending_journals.pop(path, None) if path is not None else None
    return journal if journal is not None else _original_create_journal(path)


_syncobj_module.createJournal = _create_journal


class _KeptCommittedFilter(logging.Filter):
    """pysyncobj logs CRITICAL "truncating already-applied log entries ... may have diverged"
    before it asks the journal to cut; the DurableJournal keeps committed entries (and stops
    the node if one ever differs), so say what really happens, at INFO."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.startswith("truncating already-applied log entries"):
            record.msg = ("an AppendEntries asked to cut applied entries from index %d (last applied %d); "
                          "the journal keeps committed entries")
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


logging.getLogger(_syncobj_module.__name__).addFilter(_KeptCommittedFilter())


class _SyncingTransport(TCPTransport):
    """TCP transport that makes the journal durable before any message leaves, except the leader's AppendEntries.

    A follower's acknowledgement, a vote, anything that reflects this node's log or term, waits for
    the fdatasync.  The leader's AppendEntries go out first and the leader syncs right after (the tick
    callback), so its fdatasync runs while the followers do theirs: one disk sync on the critical path
    instead of two (Raft thesis 10.2.1).  Safe because the leader's own copy only matters for commit,
    and pysyncobj records a new commit index through ``DurableJournal.setRaftCommitIndex``, which syncs
    first: nothing is applied, answered or announced as committed before the leader's copy is durable.

    It also lets no message of a connection reach Raft before the peer's identity hello was checked
    (``quorum.identity``).
    """

    journal: DurableJournal
    identity: NodeIdentity
    owner: "RaftNode"

    def send(self, node, message):
        if not (isinstance(message, dict) and message.get("type") == "append_entries"):
            self.journal.sync()
        return super().send(node, message)

    def _onNodeConnected(self, node):
        self.owner._verified.pop(node.address, None)
        # First on the connection, so it arrives before anything pysyncobj sends on it.
        super().send(node, self.identity.hello.message())
        super()._onNodeConnected(node)

    def _onNodeDisconnected(self, node):
        self.owner._verified.pop(node.address, None)
        super()._onNodeDisconnected(node)

    def _onMessageReceived(self, node, message):
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == "pq_hello":
            self.owner._on_hello(node, message)
            return
        if kind == "pq_refused":
            self.owner._on_refused(node, message)
            return
        if kind == "pq_hello_request":
            super().send(node, self.identity.hello.message())
            return
        verdict = self.owner._verified.get(node.address)
        if verdict is not True:
            self.owner.unverified_dropped += 1
            if verdict is None:
                # Traffic before the peer's hello (its hello went out on a connection that was then
                # replaced, or a message raced it): ask for the hello again, at most twice a second.
                now = time.monotonic()
                if now - self.owner._hello_asked.get(node.address, float("-inf")) >= 0.5:
                    self.owner._hello_asked[node.address] = now
                    super().send(node, {"type": "pq_hello_request"})
            return
        super()._onMessageReceived(node, message)

    def destroy(self):
        # pysyncobj's destroy() drops every node: that is a shutdown, not a membership change, and the
        # identities this node learnt must survive it (else a wiped or restored peer is accepted after
        # a restart of this node).
        self._destroying = True
        super().destroy()

    def dropNode(self, node):
        # A membership change removed ``node``: a fresh node may later be added at its address.
        if not getattr(self, "_destroying", False):
            self.identity.forget(node.address)
        self.owner.peer_clients.pop(node.address, None)
        super().dropNode(node)


class _Replicated(SyncObj):
    def __init__(self, self_addr, partners, conf, transport_class, on_apply):
        self._on_apply = on_apply
        super().__init__(self_addr, partners, conf, transportClass=transport_class)

    @replicated
    def apply_entry(self, payload):
        # pysyncobj increments raftLastApplied after this returns, so the index
        # of the entry being applied is raftLastApplied + 1, on replay too.
        return self._on_apply(self.raftLastApplied + 1, bytes(payload))


class RaftNode:
    """A running Raft member.

    ``on_apply(index, term, payload) -> result`` is called for every committed entry,
    in order, from pysyncobj's thread.  ``snapshot_state() -> records`` and
    ``restore_state(records, last_index)`` turn the state into records and back.
    """

    def __init__(self, self_addr: str, partners: list[str], data_dir: str, secret: str, raft: RaftConfig,
                 on_apply: Callable[[int, int, bytes], Any], snapshot_state: Callable[[], list],
                 restore_state: Callable[[list, int], None], bind_addr: str | None = None,
                 identity: NodeIdentity | None = None):
        if not secret:
            raise ValueError("a cluster secret is required: the Raft port executes what it receives")
        raft.validate()
        self.self_addr = self_addr
        self.data_dir = data_dir
        self.journal_path = os.path.join(data_dir, "raft.journal")
        self.snapshot_path = os.path.join(data_dir, "raft.snapshot")
        self._snapshot_state = snapshot_state
        self._restore_state = restore_state
        self.last_snapshot_bytes = 0
        # Refuse to start from a damaged snapshot: pysyncobj would log and go on empty.
        if os.path.exists(self.snapshot_path):
            read_snapshot(self.snapshot_path)
        self.identity = identity or NodeIdentity.open(data_dir, secret)
        self._verified: dict[str, bool | str] = {}  # peer raft address -> True, or why it was refused
        self.peer_clients: dict[str, str] = {}  # peer raft address -> client address (from its hello)
        self.unverified_dropped = 0
        self._hello_asked: dict[str, float] = {}
        self._refusal_logged: dict[str, float] = {}
        self.journal = DurableJournal(self.journal_path)
        journal = self.journal

        class Transport(_SyncingTransport):
            pass

        Transport.journal = journal
        Transport.identity = self.identity
        Transport.owner = self
        self._transport_holder: list = []

        def make_transport(*args, **kwargs):
            t = Transport(*args, **kwargs)
            self._transport_holder.append(t)
            return t

        self.leader_changed = threading.Event()
        conf = SyncObjConf(
            password=secret,
            journalFile=self.journal_path,
            fullDumpFile=self.snapshot_path,
            serializer=self._serialize,
            deserializer=self._deserialize,
            appendEntriesUseBatch=False,
            appendEntriesPeriod=raft.heartbeat_interval,
            raftMinTimeout=raft.election_timeout_min,
            raftMaxTimeout=raft.election_timeout_max,
            connectionTimeout=raft.connection_timeout,
            connectionRetryTime=raft.reconnect_interval,
            leaderFallbackTimeout=raft.leader_step_down_timeout,
            logCompactionMinEntries=raft.compaction_min_entries,
            logCompactionMinTime=raft.compaction_min_time,
            commandsWaitLeader=False,
            dynamicMembershipChange=True,
            bindAddress=bind_addr,
            onStateChanged=lambda old, new: self.leader_changed.set(),
        )
        with _pending_lock:
            _pending_journals[self.journal_path] = journal
        try:
            self._obj = _Replicated(self_addr, partners, conf, make_transport,
                                    lambda index, payload: on_apply(index, self.entry_term(index), payload))
        finally:
            with _pending_lock:
                _pending_journals.pop(self.journal_path, None)
        self._transport = self._transport_holder[0]
        self._ping_interval = raft.peer_ping_interval
        self._last_ping = 0.0
        self._last_leader = None
        self.leader_changes = 0  # times this node saw a new leader (an election it took part in or heard of)
        self._obj.addOnTickCallback(self._on_tick)

    # ------------------------------------------------------------ snapshots
    def _serialize(self, file_name, raft_data):
        last_entry, prev_entry, cluster = raft_data
        records = self._snapshot_state()
        snap = Snapshot(records=records, last_entry=tuple(last_entry), prev_entry=tuple(prev_entry),
                        cluster=[n.address for n in cluster], meta={"written_by": self.self_addr,
                                                                     "written_at_ms": int(time.time() * 1000)})
        self.last_snapshot_bytes = write_snapshot(file_name, snap)
        log.info("snapshot at index %d: %d records, %d bytes", last_entry[1], len(records),
                 self.last_snapshot_bytes)

    def _deserialize(self, file_name):
        try:
            snap = read_snapshot(file_name)
            self._restore_state(snap.records, snap.last_index)
        except Exception:  # noqa: BLE001 - pysyncobj would swallow it and diverge; stop instead
            log.critical("cannot load snapshot %s; stopping rather than serving a wrong state", file_name,
                         exc_info=True)
            logging.shutdown()
            os._exit(EXIT_CORRUPT_SNAPSHOT)
        return (snap.last_entry, snap.prev_entry, {TCPNode(a) for a in snap.cluster})

    # -------------------------------------------------------------- identity
    def _on_hello(self, node, message) -> None:
        """A peer's hello (pysyncobj's thread): let its messages through, or refuse it and say why."""
        address = node.address
        try:
            hello = Hello.from_message(message)
            reason = self.identity.check(address, hello)
        except ValueError as e:
            reason = f"malformed hello from {address}: {e}"
        if reason is None:
            self._verified[address] = True
            if hello.client_address:
                self.peer_clients[address] = hello.client_address
            return
        self._verified[address] = reason
        now = time.monotonic()
        if now - self._refusal_logged.get(address, float("-inf")) >= 10.0:
            self._refusal_logged[address] = now
            log.error("refusing Raft traffic from %s: %s", address, reason)
        # The transport may call this while SyncObj is still being built (before self._transport is set).
        self._transport_holder[0].send(node, {"type": "pq_refused", "reason": reason, "by": self.self_addr})

    def _on_refused(self, node, message) -> None:
        """A peer refused this node's identity: never take part in Raft as this member; stop."""
        reason = message.get("reason") if isinstance(message, dict) else None
        log.critical("refusing to start: peer %s refused this node (%s): %s", node.address, self.self_addr,
                     reason if isinstance(reason, str) else "no reason given")
        logging.shutdown()
        os._exit(EXIT_IDENTITY_REFUSED)

    def peer_client_address(self, raft_address: str) -> str | None:
        return self.peer_clients.get(raft_address)

    # ------------------------------------------------------------ membership
    def members(self) -> list[str]:
        """Raft addresses of the voting members, this node first (this node's current view)."""
        return [self.self_addr] + sorted(n.address for n in self._obj.otherNodes)

    def _call(self, start: Callable[[Callable], None], timeout: float) -> None:
        done = threading.Event()
        outcome: list = []

        def callback(result, error):
            outcome.append(error)
            done.set()

        start(callback)
        if not done.wait(timeout):
            raise ProposalUnknown(f"no answer within {timeout:.1f}s")
        error = outcome[0]
        if error == FAIL_REASON.SUCCESS:
            return
        if error == FAIL_REASON.REQUEST_DENIED:
            raise ProposalRejected("request denied (a membership change is still pending, the leader has not "
                                   "committed an entry of its term yet, or the node is already in that state)")
        if error in _DEFINITE:
            raise ProposalRejected(_DEFINITE[error])
        raise ProposalUnknown(f"outcome unknown (pysyncobj reason {error})")

    def add_member(self, address: str, timeout: float) -> None:
        """Append and commit the membership entry that adds ``address`` (leader only; one change at a time)."""
        self._call(lambda cb: self._obj.addNodeToCluster(address, callback=cb), timeout)

    def remove_member(self, address: str, timeout: float) -> None:
        self._call(lambda cb: self._obj.removeNodeFromCluster(address, callback=cb), timeout)

    def transfer_leadership(self, address: str | None, timeout: float) -> None:
        """Ask the leader to hand over to ``address`` (None: the most caught-up follower).  Returns once
        the request was sent; pysyncobj denies it when the target is not fully caught up."""
        self._call(lambda cb: self._obj.transferLeadership(address, callback=cb), timeout)

    # ----------------------------------------------------------------- ticks
    def _on_tick(self):
        self.journal.sync()  # the leader's entries sent this tick (see _SyncingTransport)
        now = time.monotonic()
        if now - self._last_ping >= self._ping_interval:
            self._last_ping = now
            for node in self._obj.otherNodes:
                self._transport.send(node, {"type": "pq_ping"})
        leader = self._obj.getStatus()["leader"]
        if leader != self._last_leader:
            self._last_leader = leader
            if leader is not None:
                self.leader_changes += 1
            self.leader_changed.set()

    # ------------------------------------------------------------- proposals
    def propose(self, payload: bytes, on_done: Callable[[Any, Exception | None], None]) -> None:
        """Submit an entry; ``on_done(result, None)`` after it is applied here, or
        ``on_done(None, ProposalRejected|ProposalUnknown)``.  Called from pysyncobj's thread."""

        def callback(result, error):
            if error == FAIL_REASON.SUCCESS:
                on_done(result, None)
            elif error in _DEFINITE:
                on_done(None, ProposalRejected(_DEFINITE[error]))
            else:
                on_done(None, ProposalUnknown(f"outcome unknown (pysyncobj reason {error})"))

        self._obj.apply_entry(payload, callback=callback)

    # ---------------------------------------------------------------- status
    def status(self) -> dict[str, Any]:
        s = self._obj.getStatus()
        leader = s.get("leader")
        peers = {}
        is_leader = s["state"] == 2
        for node in self._obj.otherNodes:
            match = s.get(f"match_idx_server_{node.id}")
            peers[node.address] = {
                "connected": bool(s.get(f"partner_node_status_server_{node.id}")),
                "match_index": match,
                "next_index": s.get(f"next_node_idx_server_{node.id}"),
                # On the leader: committed entries the follower does not hold yet.
                "lag_entries": max(0, s["commit_idx"] - match) if is_leader and match is not None else None,
            }
        return {
            "self": self.self_addr,
            "state": {0: "follower", 1: "candidate", 2: "leader"}.get(s["state"], str(s["state"])),
            "leader": leader.address if leader is not None else None,
            "term": s["raft_term"],
            "commit_index": s["commit_idx"],
            "last_applied": s["last_applied"],
            "log_len": s["log_len"],
            "has_quorum": s["has_quorum"],
            "peers": peers,
            "journal_syncs": self.journal.syncs,
            "journal_sync_latency": self.journal.sync_latency.snapshot(),
            "leader_changes": self.leader_changes,
            "members": self.members(),
            "identity": self.identity.describe(),
            "refused_peers": {a: r for a, r in self._verified.items() if r is not True},
            "unverified_dropped": self.unverified_dropped,
        }

    def role(self) -> tuple[bool, str | None, int]:
        """(is leader, leader raft address or None, term)."""
        s = self._obj.getStatus()
        leader = s.get("leader")
        return s["state"] == 2, (leader.address if leader is not None else None), s["raft_term"]

    def current_term(self) -> int:
        """The term this node durably knows (cheap; for log lines)."""
        return self.journal.getCurrentTerm()

    def entry_term(self, index: int) -> int:
        entries = self.journal.entries
        if entries:
            pos = index - entries[0][1]
            if 0 <= pos < len(entries):
                return entries[pos][2]
        return -1

    def force_snapshot(self) -> None:
        self._obj.forceLogCompaction()

    def destroy(self) -> None:
        self._obj.destroy()
