"""The node facade: what the rest of the quorum uses of Raft (``RaftNode``).

It owns the node's files (``files``), builds pysyncobj's Raft with pidquorum's rules (``replication``)
over a transport with the identity gate (``gate``, ``transport``), drives it from the node's asyncio
loop or from the simulator, and decides who may count: the identity gate and the **recovery gate**.
A node that may have lost entries it acknowledged (its own files say so, or a peer saw it hold more
than it now has: ``quorum.identity``) records a recovery target durably and, until its durable log
reaches it, neither stands for election, nor votes (except for a candidate that holds its target),
nor has its acknowledgements counted; it then refuses to vote in the term it caught up in.  Since a
start on a restored copy looks like any restart, every start first needs the word of enough peers
(n - majority + 1: ``check_vouched``) of its configuration and of any newer one a peer reports with
it in it, whose log ends become its target.  Outcomes of a proposal are typed: ``ProposalRejected``
(definitely not applied) versus ``ProposalUnknown`` (may have been applied).
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
from snapshots.storage.disk import (
    EXIT_DIVERGED,
    EXIT_IDENTITY_REFUSED,
    EXIT_SOFTWARE,
    EXIT_STORAGE,
    CorruptFileError,
    Disk,
    FailStop,
    StorageFailure,
    process_failstop,
)

from .. import linkcrypto
from ..identity import Hello, NodeIdentity, Verdict
from ..journal import Position, SyncThread
from ..looppoller import LoopPoller
from .config import ProposalRejected, ProposalUnknown, RaftConfig
from .files import fmt_position, loss_evidence, open_node_files
from .gate import Gate
from .replication import Replicated, is_int
from .transport import TcpTransport
from .upstream import DEFINITE, LEADER, REQUEST_DENIED, SUCCESS, Config, ConfigError, Node, hand_over
from .upstream import clock as raft_clock

log = logging.getLogger(__name__)

MAX_MEMBERS = 64  # the most members a configuration in a peer's vouch may name
FOLLOWER_APPLY_S = 0.005  # a follower applies a commit index it learned at most this late (RaftNode.quiet_append)


class RaftNode:
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

    # ------------------------------------------------------------- the loop
    def on_loop_thread(self) -> bool:
        return self._loop_thread is not None and threading.get_ident() == self._loop_thread

    def wake(self) -> None:
        """A tick at the loop's next pass (a descriptor was ready, a command queued); one per pass."""
        if self._tick_soon is None and not self._stopping:
            self._tick_soon = self._loop.call_soon(self._loop_tick)

    def _loop_tick(self, timer: bool = False) -> None:
        """One tick on the loop; the next at the latest when ``tick_wait`` says.  A timer already set no
        later than that stays (a tick a little early is harmless; a timer replaced at every tick, two or
        three per entry, cost more than the tick's own work on the leader)."""
        if self._tick_soon is not None:
            self._tick_soon.cancel()
            self._tick_soon = None
        if timer:
            self._tick_timer = None
        if self._stopping:
            return
        self._guarded(self._obj.doTick, 0.0)
        if self._stopping:
            return
        self._arm()

    def _arm(self) -> None:
        """The timed tick no later than ``tick_wait`` says."""
        when = self._loop.time() + self.tick_wait()
        if self._tick_timer is not None:
            if self._tick_timer.when() <= when:
                return
            self._tick_timer.cancel()
        self._tick_timer = self._loop.call_at(when, self._loop_tick, True)

    def _on_ready(self, handler: Callable[[int, int], None], descr: int, event: int) -> None:
        """A descriptor of pysyncobj's is ready: its handler (messages read and acted on), then a tick.

        Except when every message read was quiet, its tick due no sooner than the timed one
        (``tick_wait``):
        * a leader's acknowledgement that commits nothing (in three nodes, the second follower's
          acknowledgement of an entry the first one's already committed): its tick would find nothing
          to commit, apply or send, and it was a third of the leader's ticks;
        * a follower's AppendEntries from its leader in the steady state (``quiet_append``): it was
          appended, synced and acknowledged in the handler; what its tick would do is apply the commit
          index it carried, which can wait ``FOLLOWER_APPLY_S``.  Then it is applied in one tick with
          those of the next AppendEntries, and not in the instants after the acknowledgement, when the
          leader needs a CPU to commit and answer.
        A read with no message (a partial one, a connection's events, pysyncobj's pipe) ticks at the loop's
        next pass, as does any read on a follower or candidate (one tick for all the pass's reads).

        On the leader a read with a message that is not quiet ticks at once, before this returns: in the
        steady state that is the first acknowledgement of an entry, whose tick commits, applies and
        answers it.  Scheduled for the next pass, that tick waited behind the pass's other callbacks
        and a poll of the selector; the second acknowledgement, usually read in a later pass, is quiet."""
        if self._stopping:
            return
        messages, quiet = self.messages_read, self.quiet
        self._guarded(handler, descr, event)
        read = self.messages_read - messages
        if read and read == self.quiet - quiet:
            if self._apply_due is not None and not self._stopping:
                self._arm()
            return
        if read and self._obj.state == LEADER:
            self._loop_tick()
            return
        self.wake()

    def quiet_append(self) -> None:
        """A follower took an AppendEntries from its leader in its term, appended every entry, cut nothing,
        changed no membership and acknowledged them (``Replicated._match_and_append``): its tick can wait,
        to apply what is committed within ``FOLLOWER_APPLY_S``."""
        self.quiet += 1
        obj = self._obj
        if self._apply_due is None and obj.commit_index > obj.last_applied:
            self._apply_due = raft_clock() + FOLLOWER_APPLY_S

    def propose_now(self) -> None:
        """The leader appends the commands queued on its loop and sends them to its followers now, then
        starts its own sync: what its next tick would do first, without the rest of that tick.

        A proposal's tick was half of the leader's ticks, and all of it but this part (the commit
        index, the step-down check, the apply, the timers, the pings) waits for the tick that the first
        acknowledgement brings, a round trip later, or the timed one.  Nothing is skipped in between
        that the entry needs: ``check_commands`` is pysyncobj's own step (it appends at the
        leader's next index in its term, registers the callback and sends the AppendEntries), and
        ``start_sync`` is ``_on_tick``'s, so the entry's durability is as before (``Gate``): nothing is
        committed before its sync is collected."""
        if not self._stopping:
            self._guarded(self._propose_now)

    def _propose_now(self) -> None:
        self._obj.check_commands()
        self.journal.start_sync()

    def _guarded(self, fn: Callable, *args) -> None:
        """Fail-stop: any exception stops the node.  The loop itself would log it and go on, which after
        a failed fsync means acknowledging entries that were never written.  Nothing of this node runs
        after it (``halt``), whether ``failstop`` ends the process or, in a test, returns."""
        try:
            fn(*args)
        except StorageFailure as e:
            self.halt()
            self.failstop(EXIT_STORAGE, f"the Raft tick hit an I/O error: {e}")
        except Exception as e:  # noqa: BLE001 - fail-stop on anything unexpected
            self.halt()
            log.critical("the Raft tick failed", exc_info=True)
            self.failstop(EXIT_SOFTWARE, f"the Raft tick failed: {type(e).__name__}: {e}")
        except BaseException:
            self.halt()
            raise

    def halt(self) -> None:
        """No tick, no message handled after this (on the loop's thread); the sockets stay as they are."""
        self._stopping = True
        for handle in (self._tick_soon, self._tick_timer):
            if handle is not None:
                handle.cancel()
        self._tick_soon = self._tick_timer = None
        if self._poller is not None:
            self._poller.close()

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

    def tick_wait(self) -> float:
        """How long the node may wait for messages before its next tick: a tick period, or less
        when the leader owes its followers an AppendEntries sooner (a new commit index: Replicated), a
        follower's election deadline comes sooner or it has committed entries to apply (``quiet_append``)."""
        obj = self._obj
        now = raft_clock()
        wait = self._tick_period
        if self._apply_due is not None and obj.commit_index > obj.last_applied:
            wait = min(wait, max(self._apply_due - now, 0.0))  # what a follower learned is committed (quiet_append)
        if obj.state == LEADER:
            return min(wait, max(obj.next_append_time - now, 0.0))
        # A follower or candidate wakes for its election deadline, not at the next tick after it: the
        # followers of a lost leader campaign at the instants they drew (``Replicated.on_node_disconnected``), so
        # they do not split the vote by falling due in the same tick.  (A deadline already past: the tick
        # about to run starts the election, or this node reaches nobody and has nothing to wake for.)
        remaining = obj.election_deadline - now
        return wait if remaining <= 0 else min(wait, remaining)

    def _on_raft_thread(self, fn: Callable[[], None]) -> None:
        self._calls.put(fn)
        if self._loop is not None:
            if self.on_loop_thread():
                self.wake()
            else:
                self._loop.call_soon_threadsafe(self.wake)

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

    def adopt_target(self, target: Position, reason: str) -> None:
        """This node may have lost entries it acknowledged, up to ``target``: record that durably, then
        stop voting, standing and counting until the durable log reaches it."""
        target = (int(target[0]), int(target[1]))
        current = self.recovery
        new = max(current, target) if current is not None else target
        if self.journal.durable_end() >= new:
            return
        if new != current:
            self.journal.set_recovery_target(new)  # durable before this node acts on anything else
            self.recovery, self.recovery_reason = new, reason
            log.warning("this node may have lost entries it acknowledged (%s): it will not vote, stand for "
                        "election or count toward a majority until its log reaches %s (now %s)", reason,
                        fmt_position(new), fmt_position(self.journal.durable_end()))
        obj = getattr(self, "_obj", None)
        if obj is not None:
            obj.step_down()

    @property
    def restricted(self) -> bool:
        """Neither votes (but see _may_vote), nor stands for election, nor counts toward a majority."""
        return self.recovery is not None or not self.vouched

    @staticmethod
    def _needed(members: set) -> int:
        """Of a configuration of ``members`` (this node among them), the others whose word meets every
        majority this node could have been part of without itself: n - majority + 1 of the n - 1 others
        (both in three nodes, three of four in five)."""
        n = len(members)
        return min(n - (n // 2 + 1) + 1, n - 1)

    def vouchers_needed(self) -> int:
        """Peers whose word a restarted node needs in its own configuration (``_needed``)."""
        return self._needed({self.self_addr, *(n.address for n in self._obj.other_nodes)})

    def _configurations(self) -> list[set]:
        """The configurations whose majorities this start's word must meet: this node's own, and every newer
        one a peer that gave its word reported with this node in it.  A start on a copy from before a
        membership change knows only the configuration of its time; the changes since may have made
        majorities that hold none of its own peers (two members add a third: the new one and this node were
        a majority without the other), and the entries they committed are on none of its own peers' logs.

        A peer whose configuration's entry is committed on it holds every committed entry below that entry
        (Raft's log matching): its word stands for every older configuration, this node's own included, which
        then asks for no more words (a copy from before a replacement does not wait for the member replaced,
        which never comes back)."""
        own = frozenset({self.self_addr, *(n.address for n in self._obj.other_nodes)})
        newer, index = [], None
        for members, at, committed in self._voucher_configs.values():
            if self.self_addr not in members:
                continue
            if index is None:
                index = self._obj.config_index()  # a scan of the journal: only when a peer reports one
            if at > index:
                newer.append((at, members, committed))
        base = max((at for at, _, committed in newer if committed), default=None)
        out = [own] if base is None else []
        for at, members, _ in sorted(newer, key=lambda x: x[0]):
            if (base is None or at >= base) and members not in out:
                out.append(members)
        return [set(m) for m in out]

    def _vouch_shortfall(self, configurations: list[set] | None = None) -> list[tuple[set, int, list[str]]]:
        """Each configuration whose word is not in yet: (its members, peers needed, peers heard)."""
        short = []
        for members in configurations if configurations is not None else self._configurations():
            heard = sorted(a for a in self._vouchers if a in members and a != self.self_addr)
            if len(heard) < self._needed(members):
                short.append((members, self._needed(members), heard))
        return short

    def check_vouched(self) -> None:
        """Vouched once enough peers of each configuration (``_configurations``, ``_needed``) sent their
        verdict in this run: then the node reaches the highest log end they reported before it counts, and
        casts no vote up to their highest term (a vote of a lost run may be missing from its files).

        A start on the operator's word (``--trust-own-log``) is vouched from the start, but a recovery target
        it adopts (a peer saw it hold more than its files have: the word was wrong) is settled by the same
        words: lowered to the highest log end of enough peers, never kept above every log (a target on an
        entry no node holds, never committed, that held this node back for good)."""
        if self._peers_vouched or (self.vouched and self.recovery is None):
            return
        if any(v is True and not self._welcomed.get(a) for a, v in self._verified.items()):
            # A peer linked to this node has not given its word yet: it may report a configuration newer than
            # this node's own (a member added since, which lists this node and connects to it), which asks
            # for more words.  Its word follows its hello (or the link closes, and it is no longer waited for).
            return
        configurations = self._configurations()  # (a scan of the journal when a peer reported one: once)
        if self._vouch_shortfall(configurations):
            return
        members = set().union(*configurations) - {self.self_addr}
        have = sorted(a for a in self._vouchers if a in members)
        if not self.vouched:
            self.vouched = True
            if have:
                self._obj.vouched_term(max(self._vouchers[a][1] for a in have))
        targets = [t for a in have if (t := self._vouchers[a][0]) is not None]
        top = max(targets) if targets else None
        log.info("vouched for by %s (log end %s, theirs up to %s)", ", ".join(have), fmt_position(self.journal.durable_end()),
                 fmt_position(top) if top else "-")
        # Every entry this node may have acknowledged that was committed is on one of these peers' logs: a
        # majority held it, and these peers meet every majority the node was part of.  So the highest of their
        # log ends is the whole target.  A higher one from before (what a peer saw this node hold in an earlier
        # run, its own files' evidence, a target recorded before the last stop) names entries no majority
        # holds: never committed.  Kept, it can stall the cluster for good (a restored leader's own entry,
        # never committed, that no node holds any more, while every other node waits to reach this one's log).
        # An older peer reports no log end; then nothing is lowered.
        self._peers_vouched = True
        if self.recovery is not None and not (set(have) & self._unknown_ends) and (top is None or top < self.recovery):
            lowered = top if top is not None else (0, 0)
            log.warning("recovery target %s lowered to %s, the highest log end of the peers that vouched for this "
                        "start (%s): what lies above it was never committed", fmt_position(self.recovery), fmt_position(lowered),
                        ", ".join(have))
            self.journal.set_recovery_target(lowered)
            self.recovery, self.recovery_reason = lowered, (
                f"the peers that vouched for this start ({', '.join(have)}) hold {fmt_position(lowered)}")
            self.check_recovery()
        if top is not None:
            self.adopt_target(top, f"the peers that vouched for this start ({', '.join(have)}) hold "
                                   f"{fmt_position(top)}: a restored copy would lack what it acknowledged")

    def check_recovery(self) -> None:
        if self.recovery is None or self.journal.durable_end() < self.recovery:
            return
        self._obj.no_vote_this_term()  # a vote in this term may have been lost with the log: cast none
        self.journal.set_recovery_target(None)
        log.warning("caught up to %s (log now %s): this node votes and counts toward a majority again",
                    fmt_position(self.recovery), fmt_position(self.journal.durable_end()))
        self.recovery = self.recovery_reason = None

    # -------------------------------------------------------------- identity
    def hello_message(self) -> dict:
        message = self.identity.hello.message(self.journal.durable_end())
        if self.link_master is not None and linkcrypto.OFFERED:
            message["codecs"] = list(linkcrypto.OFFERED)  # an earlier version ignores the field
        message["pre_vote"] = True  # this node answers pq_pre_vote (an earlier version ignores the field)
        return message

    def votes_without_pre_vote(self, address: str) -> bool:
        """``address``'s hello came, without ``pre_vote``: a node of an earlier version, which never answers a
        pre-vote and votes as it always did (``Replicated._election_due`` counts it as granted)."""
        return self._pre_vote_peers.get(address) is False

    def _reset_peer_checks(self, node) -> None:
        """A connection to ``node`` was (re)established or lost: its checks start again."""
        self._verified.pop(node.address, None)
        self._welcomed.pop(node.address, None)
        self._outside.pop(node.address, None)

    def _admitted(self, address: str) -> bool:
        return self._verified.get(address) is True and self._welcomed.get(address, False)

    def _not_admitted(self, node) -> None:
        """Raft traffic before both checks passed is dropped; ask for what is missing, twice a second at most."""
        self.unverified_dropped += 1
        address = node.address
        if isinstance(self._verified.get(address), str):
            return  # refused
        now = raft_clock()
        if now - self._nudged.get(address, float("-inf")) < 0.5:
            return
        self._nudged[address] = now
        if address not in self._verified:
            self._transport.send_unsynced(node, {"type": "pq_hello_request"})
        else:
            self._transport.send_unsynced(node, self.hello_message())  # answered with its verdict

    def _on_hello(self, node, message) -> None:
        """A peer's hello (in a tick): our verdict on it, sent back to it."""
        address = node.address
        # A peer outside this node's configuration (its log lacks the entry that added it, or it was removed)
        # is checked alike, but what it presents is recorded only once it is a member (``became_member``):
        # a node removed and still running must not make a fresh node added later at its address look like a
        # lost data directory.
        member = any(n.address == address for n in self._obj.other_nodes)
        try:
            hello = Hello.from_message(message)
            verdict = self.identity.admit(address, hello, record=member)
        except ValueError as e:
            hello, verdict = None, Verdict(refused=f"malformed hello from {address}: {e}")
        if verdict.refused is not None:
            self._refuse(node, verdict.refused)
            return
        self._verified[address] = True
        if member:
            self._outside.pop(address, None)
        else:
            self._outside[address] = (node, hello)
        if hello.proto < 2:
            self._welcomed[address] = True  # an older version sends no verdict
        if hello.client_address:
            self.peer_clients[address] = hello.client_address
        self._pre_vote_peers[address] = message.get("pre_vote") is True
        if verdict.new_run:
            self._obj.forget_match(node)
        if verdict.recover is not None:
            log.warning("%s started with its log at %s, below %s it was seen to hold: it must catch up before it "
                        "votes or counts toward a majority", address, fmt_position(hello.log_end), fmt_position(verdict.recover))
        held = self.identity.held(address)
        self._transport_holder[0].send_unsynced(node, {
            "type": "pq_welcome", "by": self.self_addr,
            "recover": list(verdict.recover) if verdict.recover is not None else None,
            "vouch": {"log_end": list(self.journal.durable_end()), "held": list(held) if held else None,
                      "term": self._obj.current_term(),
                      "config": self._config_word()}})

    def _config_word(self) -> dict:
        """This node's configuration as its word carries it: members, the log index of the entry that made
        it, and whether that entry is committed here (``_configurations``)."""
        at = self._obj.config_index()
        return {"members": self.members(), "index": at, "committed": self._obj.commit_index >= at}

    def _refuse(self, node, reason: str) -> None:
        address = node.address
        self._verified[address] = reason
        self._outside.pop(address, None)
        now = raft_clock()
        if now - self._refusal_logged.get(address, float("-inf")) >= 10.0:
            self._refusal_logged[address] = now
            log.error("refusing Raft traffic from %s: %s", address, reason)
        self._transport_holder[0].send_unsynced(node, {"type": "pq_refused", "reason": reason, "by": self.self_addr})

    def became_member(self, node) -> None:
        """A membership entry made ``node`` a member while its link was up as an outside peer's: what its
        hello presented is recorded now, as a member's is at its hello (and refused as there)."""
        outside = self._outside.pop(node.address, None)
        if outside is None:
            return
        verdict = self.identity.admit(node.address, outside[1])
        if verdict.refused is not None:
            self._refuse(outside[0], verdict.refused)

    def _on_welcome(self, node, message) -> None:
        """A peer's verdict on this node: welcomed, perhaps with a position this node must reach first,
        and its word for this start (its log end, what it saw this node hold, its term)."""
        vouch = message.get("vouch")
        if isinstance(vouch, dict) and not self._peers_vouched:
            ends = [vouch.get("log_end"), vouch.get("held")]
            term = vouch.get("term")
            if is_int(term) and term >= 0 and all(e is None or (isinstance(e, (list, tuple)) and len(e) == 2 and all(
                    is_int(x) and x >= 0 for x in e)) for e in ends):
                # Its log end, not what it saw this node hold: see check_vouched.
                self._vouchers[node.address] = (tuple(ends[0]) if ends[0] is not None else None, term)
                if ends[0] is None:
                    self._unknown_ends.add(node.address)
                config = vouch.get("config")  # an earlier version sends none
                if (isinstance(config, dict) and is_int(config.get("index")) and config["index"] >= 0
                        and isinstance(config.get("members"), list) and 0 < len(config["members"]) <= MAX_MEMBERS
                        and all(isinstance(a, str) and 0 < len(a) <= 300 for a in config["members"])):
                    self._voucher_configs[node.address] = (frozenset(config["members"]), config["index"],
                                                           config.get("committed") is True)
                elif config is not None:
                    log.warning("ignoring a malformed configuration in the vouch of %s: %r", node.address,
                                str(config)[:200])
            else:
                log.warning("ignoring a malformed vouch from %s: %r", node.address, vouch)
        elif vouch is None and not self._peers_vouched:
            self._vouchers[node.address] = (None, 0)  # an older version's verdict: its recover target below
            self._unknown_ends.add(node.address)
        target = message.get("recover")
        if target is not None and self._peers_vouched:
            log.info("%s saw this node hold %r in an earlier run; the peers that vouched for this start set its "
                     "target already", node.address, target)
        elif target is not None:
            if not (isinstance(target, (list, tuple)) and len(target) == 2 and all(is_int(x) and x >= 0
                                                                                     for x in target)):
                log.warning("ignoring a malformed verdict from %s: recover=%r", node.address, target)
                return
            self.adopt_target(tuple(target), f"{node.address} saw this node hold {fmt_position(tuple(target))}")
        self._welcomed[node.address] = True
        self.check_vouched()

    def _on_refused(self, node, message) -> None:
        """A peer refused this node's identity: never take part in Raft as this member; stop."""
        reason = message.get("reason") if isinstance(message, dict) else None
        self.failstop(EXIT_IDENTITY_REFUSED, f"refusing to start: peer {node.address} refused this node "
                                             f"({self.self_addr}): "
                                             f"{reason if isinstance(reason, str) else 'no reason given'}")

    def _on_ping(self, node, message) -> None:
        pos = message.get("log")
        if isinstance(pos, (list, tuple)) and len(pos) == 2 and all(is_int(x) and x >= 0 for x in pos):
            self.identity.note_held(node.address, (pos[0], pos[1]))

    def peer_client_address(self, raft_address: str) -> str | None:
        return self.peer_clients.get(raft_address)

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

