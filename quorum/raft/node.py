"""The node facade: what the rest of the quorum uses of Raft (``RaftNode``).

It owns the node's files (``files``), builds pysyncobj's Raft with pidquorum's rules (``replication``)
over a transport with the identity gate (``gate``, ``transport``), and keeps start-up, proposals,
membership, status and the snapshot files here.  Mixed in, sharing its state: the tick on the node's
asyncio loop or the simulator's (``loop``), who may vote, stand and count after a start (``recovery``;
``docs/durability.md``), the identity checks on its links (``peers``).  Outcomes of a proposal are typed:
``ProposalRejected`` (definitely not applied) versus ``ProposalUnknown`` (may have been applied).
"""
from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
import time
from typing import Any, Callable

from snapshots.format import Snapshot
from snapshots.storage.disk import EXIT_DIVERGED, CorruptFileError, Disk, FailStop, process_failstop

from .. import linkcrypto
from ..identity import NodeIdentity
from ..journal import Position, SyncThread
from ..looppoller import LoopPoller
from .config import ProposalRejected, ProposalUnknown, RaftConfig
from .files import loss_evidence, open_node_files
from .gate import Gate
from .loop import FOLLOWER_APPLY_S, LoopDriver
from .peers import MAX_MEMBERS, PeerChecks
from .recovery import RecoveryGate
from .replication import Replicated
from .transport import TcpTransport
from .upstream import DEFINITE, LEADER, REQUEST_DENIED, SUCCESS, Config, ConfigError, Node, hand_over
from .upstream import clock as raft_clock

log = logging.getLogger(__name__)

__all__ = ["FOLLOWER_APPLY_S", "MAX_MEMBERS", "RaftNode", "loss_evidence"]


class RaftNode(LoopDriver, RecoveryGate, PeerChecks):
    """A running Raft member.

    ``on_apply(index, term, payload) -> result`` is called for every committed entry,
    in order, on the thread that ticks Raft.  ``snapshot_state() -> records`` and
    ``restore_state(records, last_index)`` turn the state into records and back.
    ``disk`` and ``failstop`` are the node's storage and its way to stop, ``transport_class`` the
    transport under the identity gate (``TcpTransport`` by default; the simulator's implements
    ``upstream.MessageTransport``), ``node_class`` the node type (``upstream.Node``), ``clock`` what gives wall time (``time``); tests and the simulator pass their
    own.

    Who ticks Raft:

    * ``loop`` (a node process, and the in-process test clusters): the asyncio loop that also serves
      the client port, created on that loop's thread.  pysyncobj's sockets wait on the loop
      (``quorum.looppoller``) and every tick runs there, so a proposal and its outcome never cross
      threads; the leader's own fdatasync runs on a sync thread of the node's (``journal.SyncThread``).
    * no loop (the simulation): the caller, with ``tick()``; the leader's own fdatasync then runs where
      its sync is collected (``journal.Syncer``: deterministic, and the latest it can be).

    Either way any exception in a tick or in a message's handling stops the node (``failstop``):
    pysyncobj's own loop logged it and went on, which after a failed fsync meant acknowledging
    entries that were never written.
    """

    def __init__(self, self_addr: str, partners: list[str], data_dir: str, secret: str, raft: RaftConfig,
                 on_apply: Callable[[int, int, bytes], Any], snapshot_state: Callable[[], list],
                 restore_state: Callable[[list, int], None], bind_addr: str | None = None,
                 identity: NodeIdentity | None = None, disk: Disk | None = None,
                 failstop: FailStop | None = None, transport_class: type | None = None, clock=time,
                 node_class: type = Node, trust_own_log: bool = False,
                 loop: asyncio.AbstractEventLoop | None = None):
        if not secret:
            raise ValueError("a cluster secret is required: the Raft port executes what it receives")
        raft.validate()
        self.self_addr = self_addr
        self.data_dir = data_dir
        self._clock = clock
        self.failstop = failstop or (disk.failstop if disk is not None else process_failstop)
        self.disk = disk or Disk(self.failstop)
        self.journal_path = os.path.join(data_dir, "raft.journal")
        self.snapshot_path = os.path.join(data_dir, "raft.snapshot")
        self._on_apply = on_apply
        self._snapshot_state = snapshot_state
        self._restore_state_cb = restore_state
        self.identity = identity or NodeIdentity.open(data_dir, secret, disk=self.disk)
        self.last_snapshot_bytes = 0
        self.last_compaction = raft_clock()
        self.votes_withheld = 0
        self.unverified_dropped = 0
        self._verified: dict[str, bool | str] = {}  # peer raft address -> True, or why it was refused
        self._welcomed: dict[str, bool] = {}  # peer raft address -> its verdict on this node arrived
        self.peer_clients: dict[str, str] = {}  # peer raft address -> client address (from its hello)
        self._pre_vote_peers: dict[str, bool] = {}  # peer raft address -> its last hello said it speaks pre-vote
        self._nudged: dict[str, float] = {}
        self._outside: dict[str, tuple] = {}  # raft address -> (node, hello) of an admitted peer outside the config
        self._refusal_logged: dict[str, float] = {}
        self._calls: queue.SimpleQueue = queue.SimpleQueue()  # closures to run at the next tick
        self._loop = loop
        self._loop_thread = threading.get_ident() if loop is not None else None
        self._tick_soon: asyncio.Handle | None = None
        self._tick_timer: asyncio.TimerHandle | None = None
        self._stopping = False
        self.messages_read = 0  # messages read from peers (``Gate``)
        # Of them, those whose tick can wait for the timed one (``_on_ready``): a leader's acknowledgements
        # that commit nothing, a follower's AppendEntries from its leader taken in the steady state.
        self.quiet = 0
        self._apply_due: float | None = None  # a follower applies what it learned is committed by then

        # Durable state: snapshot, journal, and the two made to agree before pysyncobj sees them.
        files = open_node_files(self.disk, data_dir)
        self.store, self.journal, snap = files.store, files.journal, files.snapshot
        if files.note:
            log.warning("start-up: %s", files.note)
        self.last_snapshot_bytes = self.store.size
        # Every start may be of a restored copy: until enough peers vouched for it (see check_vouched)
        # this node neither votes, nor stands, nor counts toward a majority.
        self._vouchers: dict[str, tuple[Position | None, int]] = {}  # peer -> (its log end, its term)
        # peer -> (its configuration, the index of the entry that made it, whether that entry is committed there)
        self._voucher_configs: dict[str, tuple[frozenset, int, bool]] = {}
        self._unknown_ends: set[str] = set()  # vouchers of an earlier version (no log end in their verdict)
        self._peers_vouched = False  # the peers' word set this start's target (not the operator's)
        self.vouched = not partners or trust_own_log
        if trust_own_log and partners:
            log.warning("started with the operator's word that this data directory was not restored from a copy "
                        "(--trust-own-log): votes and acknowledgements count without the peers' word")
        self.recovery: Position | None = self.journal.recovery_target()
        self.recovery_reason: str | None = "recorded before the last stop" if self.recovery else None
        self._own_loss_evidence(snap)
        if self.recovery is not None and not partners:
            raise CorruptFileError(self.journal_path, f"this single-node cluster may have lost entries it "
                                                      f"committed ({self.recovery_reason}), and no peer holds them")
        last = self.journal.entries[-1][1] if self.journal.entries else (snap.last_index if snap else 0)
        self.journal.clamp_commit_index(max(last, snap.last_index if snap else 0))

        # The Raft port seals messages with AES-GCM per connection once both ends offer it (quorum.linkcrypto);
        # a transport given by the caller (the simulation's) has no connections to seal.
        self.link_master = linkcrypto.master_key(secret) if secret and transport_class is None else None
        self.leader_changed = threading.Event()
        node = self
        conf = Config(
            password=secret,
            journalFile=self.journal_path,
            fullDumpFile=self.snapshot_path,
            autoTick=False,
            appendEntriesUseBatch=False,
            appendEntriesPeriod=raft.heartbeat_interval,
            raftMinTimeout=raft.election_timeout_min,
            raftMaxTimeout=raft.election_timeout_max,
            connectionTimeout=raft.connection_timeout,
            connectionRetryTime=raft.reconnect_interval,
            leaderFallbackTimeout=raft.leader_step_down_timeout,
            logCompactionMinEntries=raft.compaction_min_entries,
            logCompactionMinTime=raft.compaction_min_time,
            logCompactionBatchSize=raft.snapshot_chunk_bytes,
            appendEntriesBatchSizeBytes=raft.append_entries_batch_bytes,
            commandsWaitLeader=False,
            dynamicMembershipChange=True,
            # pysyncobj binds 0.0.0.0 without a bind address; bind the advertised host instead.
            bindAddress=bind_addr or self_addr,
            bindRetryTime=0.25,
            maxBindRetries=20,
            onStateChanged=lambda old, new: node.leader_changed.set(),
        )
        self._tick_period = conf.autoTickPeriod

        class Transport(Gate, transport_class or TcpTransport):
            owner = node
            limits = raft.link_limits()

        self._transport_holder: list = []

        def make_transport(*args, **kwargs):
            t = Transport(*args, **kwargs)
            self._transport_holder.append(t)
            return t

        self._poller = LoopPoller(loop, self._on_ready) if loop is not None else None
        try:
            with hand_over(self.journal_path, self.journal, self.snapshot_path, self.store,
                           conf.logCompactionBatchSize):
                self._obj = Replicated(self_addr, partners, conf, make_transport, self, node_class, self._poller)
        except ConfigError as e:
            raise OSError(f"cannot bind the Raft port {bind_addr or self_addr}: {e.errorCode}") from None
        self._transport = self._transport_holder[0]
        if snap is not None:
            self._obj.load_snapshot(snap)
        self._obj.need_load_dump = False
        changes = self._obj.adopt_log_configuration(snap.last_index if snap is not None else 0)
        if changes:
            log.info("start-up: %d membership change(s) in the journal applied (members: %s)", changes,
                     ", ".join(self.members()))
        self._ping_interval = raft.peer_ping_interval
        self._last_ping = 0.0
        self._last_flush = raft_clock()
        self._last_leader = None
        self.leader_changes = 0  # times this node saw a new leader (an election it took part in or heard of)
        self._obj.addOnTickCallback(self._on_tick)
        if loop is not None:
            self.journal.syncer = SyncThread(f"sync-{self_addr}")
            self.wake()

    def tick(self, timeout: float = 0.0) -> None:
        """One tick, for a caller that drives the node itself (no ``loop``: the simulation)."""
        self._obj.doTick(timeout)

    def _on_tick(self) -> None:
        self._apply_due = None  # this tick applied every committed entry (pysyncobj applies before this runs)
        self.journal.start_sync()  # the leader's entries sent this tick: durable while it reads acks (see Gate)
        self.check_vouched()  # (the membership may have shrunk)
        self.check_recovery()
        while True:
            try:
                call = self._calls.get_nowait()
            except queue.Empty:
                break
            call()
        now = raft_clock()
        if now - self._last_ping >= self._ping_interval:
            self._last_ping = now
            ping = {"type": "pq_ping", "log": list(self.journal.durable_end())}
            for node in [*self._obj.other_nodes, *(n for n, _ in self._outside.values())]:
                self._transport.send_unsynced(node, ping)
        if now - self._last_flush >= 1.0:
            self._last_flush = now
            self.identity.flush()
        leader = self._obj.leader
        if leader != self._last_leader:
            self._last_leader = leader
            if leader is not None:
                self.leader_changes += 1
            self.leader_changed.set()

    # ----------------------------------------------------------- durability
    def _apply(self, index: int, payload: bytes):
        return self._on_apply(index, self.entry_term(index), payload)

    def _restore_state(self, records: list, last_index: int) -> None:
        self._restore_state_cb(records, last_index)

    def compact(self, prev, last, cluster: list[str]) -> None:
        """Snapshot the applied state at ``last`` and cut the journal before ``prev``, in that order,
        each step durable: at every instant the files hold every committed entry."""
        records = self._snapshot_state()
        snap = Snapshot(records=records, last_entry=tuple(last), prev_entry=tuple(prev), cluster=cluster,
                        meta={"written_by": self.self_addr, "written_at_ms": int(self._clock.time() * 1000)})
        self.last_snapshot_bytes = self.store.write(snap)
        self.journal.rebase(tuple(prev), tuple(last))
        log.info("snapshot at index %d: %d records, %d bytes; journal now starts at %d", last[1], len(records),
                 self.last_snapshot_bytes, prev[1])

    def install(self, snap: Snapshot, data: bytes) -> None:
        """A snapshot from the leader: the file durable first, then the journal rebased on it."""
        self.store.install(data)
        self.last_snapshot_bytes = len(data)
        dropped = self.journal.rebase(snap.prev_entry, snap.last_entry)
        log.info("installed a snapshot at index %d from the leader (%d bytes)%s", snap.last_index, len(data),
                 f"; dropped {dropped} uncommitted entries after it" if dropped else "")

    def diverged(self, index: int, term: int, held) -> None:
        self.failstop(EXIT_DIVERGED, f"the leader sent entry {index} (term {term}) but this node committed term "
                                     f"{held[2]} there: this node's log diverged (journal {self.journal_path})")

    # ------------------------------------------------------------- recovery
    def _own_loss_evidence(self, snap: Snapshot | None) -> None:
        for target, reason in loss_evidence(self.journal, snap, self.identity.existed, self.data_dir):
            self.adopt_target(target, reason)

    # ------------------------------------------------------------ membership
    def members(self) -> list[str]:
        """Raft addresses of the voting members, this node first (this node's current view)."""
        return [self.self_addr] + sorted(n.address for n in self._obj.other_nodes)

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
        if error == SUCCESS:
            return
        if error == REQUEST_DENIED:
            raise ProposalRejected("request denied (a membership change is still pending, the leader has not "
                                   "committed an entry of its term yet, or the node is already in that state)")
        if error in DEFINITE:
            raise ProposalRejected(DEFINITE[error])
        raise ProposalUnknown(f"outcome unknown (pysyncobj reason {error})")

    def add_member(self, address: str, timeout: float) -> None:
        """Append and commit the membership entry that adds ``address`` (leader only; one change at a time)."""
        self._call(lambda cb: self._obj.addNodeToCluster(address, callback=cb), timeout)

    def remove_member(self, address: str, timeout: float) -> None:
        self._call(lambda cb: self._obj.removeNodeFromCluster(address, callback=cb), timeout)

    def transfer_leadership(self, address: str | None, timeout: float) -> None:
        """Ask the leader to hand over to ``address`` (None: the most caught-up follower).  Returns once
        the request was sent; pysyncobj denies it when the target is not fully caught up."""
        self._call(lambda cb: self._on_raft_thread(lambda: self._obj.transferLeadership(address, callback=cb)),
                   timeout)

    # ------------------------------------------------------------- proposals
    def propose(self, payload: bytes, on_done: Callable[[Any, Exception | None], None]) -> None:
        """Submit an entry; ``on_done(result, None)`` after it is applied here, or
        ``on_done(None, ProposalRejected|ProposalUnknown)``.  Called from any thread."""

        def callback(result, error):
            if error == SUCCESS:
                on_done(result, None)
            elif error in DEFINITE:
                on_done(None, ProposalRejected(DEFINITE[error]))
            else:
                on_done(None, ProposalUnknown(f"outcome unknown (pysyncobj reason {error})"))

        self._obj.propose_entry(payload, callback)

    # ---------------------------------------------------------------- status
    def status(self) -> dict[str, Any]:
        s = self._obj.getStatus()
        leader = s.get("leader")
        peers = {}
        is_leader = s["state"] == LEADER
        for node in self._obj.other_nodes:
            match = s.get(f"match_idx_server_{node.id}")
            peers[node.address] = {
                "connected": bool(s.get(f"partner_node_status_server_{node.id}")),
                "match_index": match,
                "next_index": s.get(f"next_node_idx_server_{node.id}"),
                # On the leader: committed entries the follower does not hold yet.
                "lag_entries": max(0, s["commit_idx"] - match) if is_leader and match is not None else None,
                "link": codec.describe() if (codec := self._transport._link(node)) is not None else None,
            }
        recovery = None
        if self.restricted:
            reason = self.recovery_reason if self.recovery is not None else (
                "waiting for the word of " + "; ".join(
                    f"{need} peer(s) of ({', '.join(sorted(members))}) (heard from {len(heard)})"
                    for members, need, heard in self._vouch_shortfall()) +
                " that this start is not of a restored copy")
            recovery = {"target": list(self.recovery) if self.recovery is not None else None,
                        "log_end": list(self.journal.durable_end()), "reason": reason,
                        "votes_withheld": self.votes_withheld, "vouched": self.vouched,
                        "vouched_by": sorted(self._vouchers)}
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
            # Linked and checked, but not in this node's configuration: a member its log does not list yet, or
            # one removed that still runs.
            "outside_peers": sorted(self._outside),
            "unverified_dropped": self.unverified_dropped,
            "recovering": recovery,
            "raft_port": dict(getattr(self._transport, "link_counters", {})),
        }

    def role(self) -> tuple[bool, str | None, int]:
        """(is leader, leader raft address or None, term).  Three fields, read without a lock as ``getStatus``
        reads them; ``getStatus`` builds pysyncobj's whole status dict, and the proposer asks this for every
        batch."""
        obj = self._obj
        state, leader, term = obj.state, obj.leader, obj.term
        return state == LEADER, (leader.address if leader is not None else None), term

    # What the simulator and tests read and do without reaching into the Raft object (callbacks get
    # (result, error): error 0 is success, anything else pysyncobj's FAIL_REASON number).
    @property
    def is_leader(self) -> bool:
        return self._obj.state == LEADER

    @property
    def raft_term(self) -> int:
        """The term this node is in now (``current_term``: the one it made durable)."""
        return self._obj.term

    @property
    def voted_for(self):
        """Whom this node voted for in ``raft_term`` (None: nobody yet)."""
        return self._obj.voted_for

    @property
    def commit_index(self) -> int:
        return self._obj.commit_index

    @property
    def last_applied(self) -> int:
        return self._obj.last_applied

    def start_add_member(self, address: str, callback: Callable[[Any, int], None]) -> None:
        self._obj.addNodeToCluster(address, callback=callback)

    def start_remove_member(self, address: str, callback: Callable[[Any, int], None]) -> None:
        self._obj.removeNodeFromCluster(address, callback=callback)

    def start_transfer(self, address: str | None, callback: Callable[[Any, int], None]) -> None:
        self._obj.transferLeadership(address, callback=callback)

    def abandon(self) -> None:
        """The process is gone (a simulated kill): its links close, its pipe's descriptors too; nothing is
        synced or written (``destroy`` is the orderly stop)."""
        obj = self._obj
        try:
            obj.transport.destroy()
        finally:
            for fd in obj.pipe_descriptors():
                try:
                    os.close(fd)
                except OSError:
                    pass

    def current_term(self) -> int:
        """The term this node durably knows (cheap; for log lines)."""
        return self.journal.getCurrentTerm()

    def entry_term(self, index: int) -> int:
        entry = self.journal.entry(index)
        return entry[2] if entry is not None else -1

    def force_snapshot(self) -> None:
        self._obj.forceLogCompaction()

    def destroy(self) -> None:
        """Stop ticking, then close: the journal synced and its meta written, the peers' positions kept.
        On the loop's thread (as every tick)."""
        self.halt()  # its descriptors off the loop too (pysyncobj's pipe would stay subscribed)
        self._obj.destroy()
        self.journal.syncer.close()
        self.identity.flush()

