"""The one module that adapts pysyncobj (in the manner of Patroni's ``dcs/raft.py``).

Nothing else in pidquorum imports pysyncobj or sees its callbacks, FAIL_REASON
values or configuration names.  pysyncobj keeps what it does well (elections,
the leader's replication loop, membership entries, TCP framing and
encryption); **this adapter owns everything that decides durability and log
matching**, because pysyncobj's own code for it is unsafe (``docs/durability.md``
has the details and the crash states):

=====================================  ============================================  ==========================
pysyncobj path                         why it is unsafe                               replaced by
=====================================  ============================================  ==========================
mmap journal, never fsync'd            acknowledged entries lost on power loss       ``quorum.journal``
compaction in two ticks                a stop in between makes the next start        ``_compact``: snapshot
(snapshot renamed, journal cut later)  ``clear()`` the journal: committed entries    durable, then the journal
                                       erased                                        rebased, in one step
start-up: journal does not match the   ``clear()``: same loss                        ``reconcile``: finish the
snapshot                                                                             cut, or refuse and say why
follower snapshot install              written and renamed without fsync, journal    ``_install``: verified,
                                       cleared and synced, then acknowledged         snapshot durable first
AppendEntries: cut after every         acknowledged entries thrown away              ``_append_entries``: Raft
prevLogIdx, even where entries match                                                 5.3, cut at the first
                                                                                     conflict only
a snapshot chunk (or serialized=None)  commit index advanced over entries never      commit only to what the
advances the commit index              verified: a node applies uncommitted entries  message verified
tick catches every exception           a failed fsync is forgotten and the next      ticks and message handlers
                                       sync is a no-op                               guarded: any error stops
                                                                                     the node
bind 0.0.0.0 when no bind address      the Raft port open on every interface         bind the advertised host
votes counted per message              a duplicated vote: two leaders in one term    counted per voter
acknowledgements carry no term         a delayed one raises a match index wrongly    term checked
restart rebuilds membership from       a restarted node cannot reach a member added  the journal's latest
committed entries only                 just before it stopped                        configuration, at start
links only nodes that list each other  a node never hears a member its log does not  ``_TcpTransport``: a link
(a connection from any other address   list yet: no word for that member's start,    whenever either node
is closed)                             no AppendEntries from it; the cluster can     lists the other
                                       wait for good
TCP connection: buffers whatever       anyone who reaches the port, without the      ``quorum.raftlink``:
length a peer announces, re-copies it  secret, makes a leader buffer gigabytes on    messages bounded before
per read; timeout checked only on      its Raft thread until it loses leadership;    they are read, a handshake
events; listen backlog 5, one accept   silent connections held for good; a flood     deadline, idle sweep, a
per readiness                          keeps members from connecting                 pending cap, accept rate
=====================================  ============================================  ==========================

Also here:

* one replicated entry point, ``apply_entry(payload)``, that applies an encoded
  batch of records (the on-disk format is then not tied to Python method names);
* the transport syncs the journal before any message that reflects this node's
  log or term leaves it; the leader's AppendEntries go first and the leader syncs
  right after, in parallel with its followers (Raft thesis 10.2.1), and records a
  commit index only after that sync (``DurableJournal.setRaftCommitIndex``);
* the identity gate and the **recovery gate**: a node that may have lost entries
  it acknowledged (its own files say so, or a peer saw it hold more than it now
  has: ``quorum.identity``) records a recovery target durably and, until its
  durable log reaches it, neither stands for election, nor votes (except for a
  candidate that holds its target), nor has its acknowledgements counted; it
  then refuses to vote in the term it caught up in.  Since a start on a restored
  copy looks like any restart, every start first needs the word of enough peers
  (n - majority + 1: ``check_vouched``) of its configuration and of any newer one
  a peer reports with it in it, whose log ends become its target;
* fast failover: short election timeouts and peer pings that keep
  follower-to-follower links alive (they also carry each node's durable log end);
* typed outcomes: ``ProposalRejected`` (definitely not applied) versus
  ``ProposalUnknown`` (may have been applied).
"""
from __future__ import annotations

import asyncio
import functools
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import pysyncobj.pickle as _pickle
import pysyncobj.syncobj as _syncobj_module
from pydantic import model_validator
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated
from pysyncobj.config import SERIALIZER_STATE
from pysyncobj.monotonic import monotonic as monotonicTime
from pysyncobj.node import TCPNode
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.syncobj import SyncObjException
from pysyncobj.tcp_connection import CONNECTION_STATE, TcpConnection
from pysyncobj.transport import TCPTransport, TransportNotReadyError

import settings
from snapshots.format import Snapshot, decode_snapshot
from snapshots.store import SnapshotStore
from storage.disk import (
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

from . import linkcrypto, looppoller, raftlink
from .identity import Hello, NodeIdentity, Verdict
from .journal import UNKNOWN_INDEX, DurableJournal, Position, SyncThread
from .linkcrypto import AEAD1, LinkCodec, MessagePickle
from .looppoller import LoopPoller
from .raftlink import Link, LinkLimits, LinkServer, refusals

log = logging.getLogger(__name__)

_FOLLOWER, _CANDIDATE, _LEADER = 0, 1, 2
MAX_MEMBERS = 64  # the most members a configuration in a peer's vouch may name
COMMIT_NOTIFY_S = 0.005  # a new commit index reaches the followers at most this late (see _Replicated)
FOLLOWER_APPLY_S = 0.005  # a follower applies a commit index it learned at most this late (RaftNode.quiet_append)
RECOVERED_VOTE = "<recovered: no vote this term>"  # votedFor after catching up (a vote there may be lost)

# pysyncobj internals this adapter reads or replaces (pysyncobj is pinned below 0.4; a release that
# renames them fails here, at import, rather than silently running its own unsafe code path).
_REPLACED = ("_SyncObj__onMessageReceived", "_SyncObj__tryLogCompaction", "_SyncObj__loadDumpFile",
             "_checkCommandsToApply")
_USED = ("_getFuncName", "_SyncObj__onLeaderChanged", "_SyncObj__applyLogEntries", "_SyncObj__setCurrentTerm",
         "_SyncObj__setState", "_SyncObj__generateRaftTimeout", "_SyncObj__sendNextNodeIdx",
         "_SyncObj__parseChangeClusterRequest", "_SyncObj__doChangeCluster", "_SyncObj__updateClusterConfiguration",
         "_SyncObj__onSetCodeVersion", "_SyncObj__onNodeDisconnected", "_SyncObj__callErrCallback", "_applyCommand")
if (POLL_EVENT_TYPE.READ, POLL_EVENT_TYPE.WRITE, POLL_EVENT_TYPE.ERROR) != (looppoller.READ, looppoller.WRITE,
                                                                             looppoller.ERROR):  # pragma: no cover
    raise ImportError("pysyncobj's poller events differ from quorum.looppoller's")
if (CONNECTION_STATE.DISCONNECTED, CONNECTION_STATE.CONNECTING, CONNECTION_STATE.CONNECTED) != (
        raftlink.DISCONNECTED, raftlink.CONNECTING, raftlink.CONNECTED):  # pragma: no cover
    raise ImportError("pysyncobj's connection states differ from quorum.raftlink's")
_missing = [name for name in _REPLACED + _USED if not hasattr(SyncObj, name)]
if _missing:  # pragma: no cover - only with an unsupported pysyncobj
    raise ImportError(f"pysyncobj {getattr(_syncobj_module, 'VERSION', '?')} lacks {', '.join(_missing)}: "
                      f"quorum.raft replaces those code paths and supports pysyncobj 0.3.16-0.3.x only")


def _clock() -> float:
    return _syncobj_module.monotonicTime()  # pysyncobj's clock (the simulator replaces it)


@settings.model
class RaftConfig:
    """Raft timing, in seconds, snake_case; mapped to pysyncobj's names in ``RaftNode`` only."""

    heartbeat_interval: float = 0.05
    election_timeout_min: float = 0.25
    election_timeout_max: float = 0.5
    connection_timeout: float = 1.0
    reconnect_interval: float = 0.1
    peer_ping_interval: float = 0.15
    leader_step_down_timeout: float = 1.0
    compaction_min_entries: int = 5000
    compaction_min_time: float = 300.0
    snapshot_chunk_bytes: int = 65536  # an InstallSnapshot message carries at most this much of the snapshot
    append_entries_batch_bytes: int = 65536  # an AppendEntries carries entries up to about this much (one at least)
    # The Raft port (quorum.raftlink): what a connection may cost before and after it proves the cluster secret.
    max_message_bytes: int = 32 * 2**20  # one message from a peer that proved the secret
    handshake_bytes: int = 4096  # one message before that
    handshake_timeout: float = 2.0  # from a connection's opening to its proof of the secret
    max_pending_connections: int = 64  # unauthenticated incoming connections at once (the oldest over it closed)
    max_pending_per_host: int = 8  # ... from one peer host
    listen_backlog: int = 1024
    accept_rate: float = 200.0  # new connections taken per second, in bursts of accept_burst (the rest queue)
    accept_burst: int = 64

    @model_validator(mode="after")
    def _check(self) -> "RaftConfig":
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
        if not 64 <= self.snapshot_chunk_bytes <= 64 * 2**20:
            problems.append("snapshot_chunk_bytes must be between 64 and 64 MiB")
        if not 64 <= self.append_entries_batch_bytes <= 64 * 2**20:
            problems.append("append_entries_batch_bytes must be between 64 and 64 MiB")
        if not 2**20 <= self.max_message_bytes <= 2**31 - 1:
            problems.append("max_message_bytes must be between 1 MiB and 2 GiB")
        elif self.max_message_bytes < 4 * self.snapshot_chunk_bytes:
            problems.append("max_message_bytes must be at least 4 x snapshot_chunk_bytes")
        if not 512 <= self.handshake_bytes <= 65536:
            problems.append("handshake_bytes must be between 512 and 65536")
        if not 0 < self.handshake_timeout <= 60:
            problems.append("handshake_timeout must be above 0 and at most 60 s")
        if not 1 <= self.max_pending_per_host <= self.max_pending_connections <= 65536:
            problems.append("need 1 <= max_pending_per_host <= max_pending_connections <= 65536")
        if not 1 <= self.listen_backlog <= 65535:
            problems.append("listen_backlog must be between 1 and 65535")
        if not 1 <= self.accept_rate <= 1e6:
            problems.append("accept_rate must be between 1 and 1,000,000 a second")
        if not 1 <= self.accept_burst <= 65535:
            problems.append("accept_burst must be between 1 and 65535")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def link_limits(self) -> LinkLimits:
        return LinkLimits(max_message_bytes=self.max_message_bytes, handshake_bytes=self.handshake_bytes,
                          handshake_timeout=self.handshake_timeout, max_pending=self.max_pending_connections,
                          max_pending_per_host=self.max_pending_per_host, listen_backlog=self.listen_backlog,
                          accept_rate=self.accept_rate, accept_burst=self.accept_burst)

    def validate(self) -> None:
        """Check again (after an attribute was assigned; construction checks already)."""
        try:
            settings.revalidate(self)
        except ValueError as e:
            raise ValueError(f"raft config: {e}") from None


class ProposalRejected(Exception):
    """The entry was definitely not applied (not leader, queue full, ...): safe to retry."""


class ProposalUnknown(Exception):
    """The entry may or may not be applied (leader change, timeout): never reuse its values."""


_DEFINITE = {FAIL_REASON.QUEUE_FULL: "queue full", FAIL_REASON.MISSING_LEADER: "no leader",
             FAIL_REASON.DISCARDED: "discarded by a new leader", FAIL_REASON.NOT_LEADER: "not the leader",
             FAIL_REASON.REQUEST_DENIED: "request denied"}

# ---------------------------------------------------------------------------
# Construction hooks.  SyncObj.__init__ calls the module-level createJournal and
# Serializer of pysyncobj.syncobj; the adapter's own journal and snapshot store are
# handed over by path, and any other use of pysyncobj is left untouched.
_pending_lock = threading.Lock()
_pending_journals: dict[str, DurableJournal] = {}
_pending_stores: dict[str, "_SnapshotShim"] = {}
_original_create_journal = _syncobj_module.createJournal
_original_serializer = _syncobj_module.Serializer


def _create_journal(path=None):
    with _pending_lock:
        journal = _pending_journals.pop(path, None) if path is not None else None
    return journal if journal is not None else _original_create_journal(path)


def _create_serializer(fileName, *args, **kwargs):
    with _pending_lock:
        shim = _pending_stores.pop(fileName, None) if fileName is not None else None
    return shim if shim is not None else _original_serializer(fileName, *args, **kwargs)


_syncobj_module.createJournal = _create_journal
_syncobj_module.Serializer = _create_serializer


class _SnapshotShim:
    """pysyncobj's Serializer interface over ``SnapshotStore``.  The leader's replication loop still
    asks it for chunks to send; everything that writes or loads a snapshot is the adapter's."""

    def __init__(self, store: SnapshotStore, batch_bytes: int):
        self.store = store
        self.batch_bytes = batch_bytes

    def checkSerializing(self):
        return SERIALIZER_STATE.NOT_SERIALIZING, None

    def getTransmissionData(self, node):
        return self.store.chunk(node, self.batch_bytes)

    def cancelTransmisstion(self, node):  # (sic) pysyncobj's name
        self.store.cancel(node)

    def serialize(self, *args, **kwargs):
        raise AssertionError("compaction is the adapter's (RaftNode._compact)")

    def deserialize(self, *args, **kwargs):
        raise AssertionError("snapshot loading is the adapter's (RaftNode._load_snapshot)")

    def setTransmissionData(self, *args, **kwargs):
        raise AssertionError("snapshot install is the adapter's (_Replicated._snapshot_chunk)")


def reconcile(journal: DurableJournal, snap: Snapshot | None, journal_path: str, snapshot_path: str) -> str | None:
    """Make the journal and the snapshot agree at start, finishing an interrupted compaction or install.

    Every state the write discipline can leave is explained and repaired (``docs/durability.md``); any
    other combination is refused with ``CorruptFileError`` naming both files.  Returns what was done
    (for the log), or None if nothing had to be.
    """
    entries = journal.entries
    if snap is None:
        if entries and entries[0][1] != 1:
            raise CorruptFileError(journal_path, f"the journal starts at index {entries[0][1]}, but there is no "
                                                 f"{snapshot_path} to hold the entries before it")
        return None
    last, prev = snap.last_entry, snap.prev_entry
    if entries and entries[0][1] > prev[1]:
        raise CorruptFileError(journal_path, f"the journal starts at index {entries[0][1]}, after the snapshot "
                                             f"{snapshot_path}, which ends at index {last[1]} (it must start at "
                                             f"{prev[1]}): entries are in neither file")
    if entries and entries[0][1] == prev[1] and len(entries) >= 2 and entries[0][2] == prev[2] \
            and entries[1][1] == last[1] and entries[1][2] == last[2]:
        return None  # the usual state: the journal starts with the snapshot's two entries
    first = entries[0][1] if entries else None
    dropped = journal.rebase(prev, last)
    if first is None:
        return f"the journal was empty: it now starts at the snapshot's last index {last[1]}"
    if dropped:
        return (f"the journal disagreed with the snapshot at index {last[1]}: dropped {dropped} entries after it "
                f"(never committed; an interrupted snapshot install)")
    return f"finished an interrupted compaction: the journal now starts at index {prev[1]} (it started at {first})"


@dataclass
class NodeFiles:
    """A node's Raft files as start-up leaves them: the snapshot store (and snapshot, if any) and the
    journal, made to agree (``reconcile``); ``note`` says what start-up had to repair."""

    store: SnapshotStore
    snapshot: Snapshot | None
    journal: DurableJournal
    note: str | None


def open_node_files(disk: Disk, data_dir: str) -> NodeFiles:
    """What a node does with its Raft files before it takes part in Raft (CorruptFileError if they
    cannot be explained)."""
    journal_path = os.path.join(data_dir, "raft.journal")
    snapshot_path = os.path.join(data_dir, "raft.snapshot")
    store = SnapshotStore(snapshot_path, disk)
    snap = store.load()
    journal = DurableJournal(journal_path, disk)
    note = reconcile(journal, snap, journal_path, snapshot_path)
    return NodeFiles(store, snap, journal, note)


def loss_evidence(journal: DurableJournal, snap: Snapshot | None, identity_existed: bool,
                  data_dir: str) -> list[tuple[Position, str]]:
    """What a node's own files say it may have lost: (position it must reach again, why) pairs.

    * the journal ends below the log end or the commit index the meta file recorded as durable
      (a disk that lost synced writes, a journal cut by a fault);
    * the meta file (term and vote) is gone while the log holds more than its first entry;
    * the data directory kept its identity but lost its Raft files.
    A position with index ``UNKNOWN_INDEX`` is reached only by an entry of a newer term.
    """
    end = journal.durable_end()
    found: list[tuple[Position, str]] = []
    meta_end = journal.meta_log_end()
    if meta_end is not None and meta_end > end:
        found.append((meta_end, f"the journal ends at {_fmt(end)}, but {journal.path}.meta recorded "
                                f"{_fmt(meta_end)} as durable"))
    commit = journal.getRaftCommitIndex() if not journal.meta_missing else 0
    if commit > end[1]:
        found.append(((journal.meta_term(), commit), f"the journal ends at index {end[1]}, below the durable "
                                                     f"commit index {commit}"))
    if journal.meta_missing and (end[1] > 1 or snap is not None):
        found.append(((end[0], UNKNOWN_INDEX), f"{journal.path}.meta (term and vote) is missing"))
    if identity_existed and journal.file_was_missing and snap is None:
        found.append(((journal.meta_term(), UNKNOWN_INDEX), f"{data_dir} has an identity but lost its Raft files "
                                                            f"(raft.journal, raft.snapshot)"))
    return found


class _Gate:
    """Mixed into the node's transport (TCP in a node process; any pysyncobj ``Transport``).

    It makes the journal durable before any message leaves, except the leader's AppendEntries.
    A follower's acknowledgement, a vote, anything that reflects this node's log or term, waits for
    the fdatasync.  The leader's AppendEntries go out first and the leader begins its sync right after
    (the tick callback, ``DurableJournal.start_sync``: the fdatasync runs on the node's sync thread
    while the node reads acknowledgements), so it runs while the followers do theirs: one disk
    sync on the critical path instead of two (Raft thesis 10.2.1).  Safe because the leader's own copy
    only matters for commit, and pysyncobj records a new commit index through
    ``DurableJournal.setRaftCommitIndex``, which first collects that sync (or syncs): nothing is
    applied, answered or announced as committed before the leader's copy is durable.

    It also lets no message of a connection reach Raft before the peer's identity hello was checked
    and the peer's verdict on this node arrived (``quorum.identity``).
    """

    owner: "RaftNode"

    def send(self, node, message):
        if not (isinstance(message, dict) and message.get("type") == "append_entries"):
            self.owner.journal.sync()
        return super().send(node, message)

    def send_unsynced(self, node, message):
        """Identity-gate messages: they carry only the durable log end, never anything unsynced."""
        return super().send(node, message)

    def _onNodeConnected(self, node):
        self.owner._reset_peer_checks(node)
        self._install_codec(node)
        # First on the connection, so it arrives before anything pysyncobj sends on it.
        super().send(node, self.owner.hello_message())
        super()._onNodeConnected(node)

    # ---------------------------------------- the link's encoding (quorum.linkcrypto)
    def _conn(self, node):
        """``node``'s TCP connection (None on a transport without one: the simulation's)."""
        return getattr(self, "_connections", {}).get(node)

    def _link(self, node) -> LinkCodec | None:
        codec = getattr(self._conn(node), "encryptor", None)
        return codec if isinstance(codec, LinkCodec) else None

    def _install_codec(self, node) -> None:
        """A new handshake on ``node``'s connection: its messages stay under Fernet until a direction switches."""
        master, fernet = self.owner.link_master, getattr(self, "_syncObj", None) and self._syncObj.encryptor
        conn = self._conn(node)
        if master is not None and fernet is not None and conn is not None and conn.encryptor is not None:
            conn.encryptor = LinkCodec(fernet, master, conn)

    def _seal_if_offered(self, node, offered) -> None:
        """The peer's hello lists what it reads: tell it, under Fernet, that what follows is sealed with AES-GCM."""
        codec = self._link(node)
        if (codec is None or codec.sealing or AEAD1 not in linkcrypto.OFFERED
                or not isinstance(offered, list) or AEAD1 not in offered):
            return
        if super().send(node, {"type": "pq_codec", "codec": AEAD1}):
            codec.seal_from_now()

    def _peer_sealing(self, node, message) -> None:
        codec, name = self._link(node), message.get("codec")
        if codec is not None and name == AEAD1 and AEAD1 in linkcrypto.OFFERED:
            codec.open_from_now()
            return
        # Nothing after this message could be read: start the connection again.
        log.error("%s seals its messages with %r, which this node did not offer: reconnecting", node.address, name)
        conn = self._conn(node)
        if conn is not None:
            conn.disconnect()

    def _onNodeDisconnected(self, node):
        self.owner._reset_peer_checks(node)
        super()._onNodeDisconnected(node)

    def _onMessageReceived(self, node, message):
        kind = message.get("type") if isinstance(message, dict) else None
        owner = self.owner
        owner.messages_read += 1
        if kind == "pq_hello":
            owner._on_hello(node, message)
            self._seal_if_offered(node, message.get("codecs"))
            return
        if kind == "pq_codec":
            self._peer_sealing(node, message)  # the link's encoding, whatever the checks: nothing else is read
            return
        if kind == "pq_welcome":
            owner._on_welcome(node, message)
            return
        if kind == "pq_refused":
            owner._on_refused(node, message)
            return
        if kind == "pq_hello_request":
            super().send(node, owner.hello_message())
            return
        if not owner._admitted(node.address):
            owner._not_admitted(node)
            return
        if kind == "pq_ping":
            owner._on_ping(node, message)
            return
        super()._onMessageReceived(node, message)

    def destroy(self):
        # pysyncobj's destroy() drops every node: that is a shutdown, not a membership change, and the
        # identities this node learnt must survive it (else a wiped or restored peer is accepted after
        # a restart of this node).
        self._destroying = True
        super().destroy()

    def addNode(self, node):
        super().addNode(node)
        # A membership entry made ``node`` a member, perhaps while its link was up as an outside peer's.
        self.owner.became_member(node)

    def dropNode(self, node):
        # A membership change removed ``node``: a fresh node may later be added at its address.
        if getattr(self, "_destroying", False):
            self.owner.peer_clients.pop(node.address, None)
            super().dropNode(node)
            return
        self.owner.identity.forget(node.address)
        self.owner.peer_clients.pop(node.address, None)
        # The link stays: the change may be an uncommitted entry that the leader (perhaps ``node`` itself)
        # will cut, and Raft servers take a leader's AppendEntries from outside their configuration.  Raft
        # counts only members: ``_Replicated`` takes nothing else from it (no vote, request or ack).


# How a reverse link names its dialler: an earlier version, which takes no such link, reads it as an address it
# does not list and closes the connection (it would otherwise take it as the peer's own link, and after it closed
# reconnect through a connection object that cannot dial: a link lost until a restart).
REVERSE_LINK = "pq-reverse:"


class _TcpTransport(TCPTransport):
    """pysyncobj's TCP transport, with a link between two nodes whenever either lists the other.

    pysyncobj links a pair only when both list each other: only the greater address connects, and a node
    closes an incoming connection from an address it does not list.  So a node whose log lacks the entry
    that added a member never hears from it: it never gives its word for the member's start
    (``check_vouched``) and never takes its AppendEntries, though Raft servers take a leader's AppendEntries
    from outside their configuration (thesis 4.1).  With that member the only node able to lead (the others
    restarted and hold back until they reach its log), the cluster waited for good (simulation seed 420719).

    * A connection from an address this node does not list is kept as an outside peer's (at most
      ``MAX_OUTSIDE`` at once).  The encryption handshake has proved the cluster secret; the identity gate
      checks its hello like any other but records nothing until the peer is a member
      (``RaftNode._on_hello``), and ``_Replicated`` takes only a leader's AppendEntries from it.  When a
      membership entry adds it, the link becomes a member's as it is (or, if this node is the one to
      connect, its own connection replaces it).
    * The lesser address of a pair connects too, to a member that has had no link to it for
      ``connection_timeout``, at most once a ``connection_timeout`` (a reverse link: the member does not list
      this node, or it is down).  It names itself with ``REVERSE_LINK``: a node that lists the dialler closes
      such a link (it connects itself), as an earlier version closes it, and a node's own link to a peer
      replaces a reverse one.

    Its connections and listener are ``quorum.raftlink``'s, not pysyncobj's: every message bounded before it
    is read, at most ``RaftConfig.handshake_bytes`` before the peer proved the cluster secret.  This class
    adds the rules that need the whole port: at most ``max_pending_connections`` unauthenticated incoming
    connections at once, ``max_pending_per_host`` from one host (over a limit, the oldest of them is closed:
    a peer's handshake takes a round trip, a connection parked by someone without the secret takes a slot
    until then); and a sweep, every ``SWEEP_S``, that closes a connection that has not proved the secret
    within ``handshake_timeout`` or read nothing for ``connection_timeout``, whether it sends or not.
    """

    MAX_OUTSIDE = 16
    SWEEP_S = 0.1
    limits = LinkLimits()  # RaftNode's transport class sets the operator's (RaftConfig.link_limits)

    def __init__(self, *args, **kwargs):
        self._linkless_since: dict = {}  # member with the greater address -> since when it has had no link
        self._reverse: set = set()  # this node's connections to members with greater addresses
        self._last_sweep = 0.0
        # The Raft port (RaftNode.status()["raft_port"]): connections accepted, times the listener paused at
        # accept_rate, connections closed for what they sent, evicted unauthenticated (over a pending cap),
        # closed by the sweep (handshake deadline or idle).
        self.link_counters = {"accepted": 0, "accept_pauses": 0, "refused_messages": 0, "refused_pending": 0,
                              "expired": 0}
        super().__init__(*args, **kwargs)

    # ------------------------------------------------------------ quorum.raftlink in pysyncobj's place
    def _new_link(self) -> Link:
        conf = self._syncObj.conf
        return Link(self._syncObj._poller, self.limits, None, conf.connectionTimeout, conf.sendBufferSize,
                    conf.recvBufferSize, conf.tcp_keepalive, counters=self.link_counters)

    def _createServer(self):
        conf = self._syncObj.conf
        host, port = conf.bindAddress.rsplit(":", 1)  # RaftNode always gives one (the advertised address)
        self._server = LinkServer(self._syncObj._poller, host.strip("[]"), int(port), self._onNewIncomingConnection,
                                  self.limits, conf.connectionTimeout, conf.sendBufferSize, conf.recvBufferSize,
                                  conf.tcp_keepalive, self.link_counters)

    def tryGetReady(self):
        # pysyncobj gives up binding after maxBindRetries with TransportNotReadyError, which its SyncObj logs
        # with a traceback and turns into SyncObjException('BindError'): the address and the reason are
        # lost.  Raise the one line a node stops with (quorum.node: exit 69) before that.
        try:
            super().tryGetReady()
        except TransportNotReadyError:
            error = getattr(self._server, "bind_error", None)
            reason = (os.strerror(error.errno) if error is not None and error.errno else str(error or "bind failed"))
            raise OSError(f"cannot bind the Raft port {self._syncObj.conf.bindAddress}: {reason}") from None

    def _onNewIncomingConnection(self, conn):
        super()._onNewIncomingConnection(conn)
        pending = [c for c in self._unknownConnections if not c.authenticated and c is not conn]
        same_host = [c for c in pending if c.peer_host == conn.peer_host]
        if len(same_host) >= self.limits.max_pending_per_host:
            rule = f"{self.limits.max_pending_per_host} from {conn.peer_host} (max_pending_per_host)"
            victim = min(same_host, key=lambda c: c.opened_at)
        elif len(pending) >= self.limits.max_pending:
            rule = f"{self.limits.max_pending} (max_pending_connections)"
            victim = min(pending, key=lambda c: c.opened_at)
        else:
            return
        self.link_counters["refused_pending"] += 1
        refusals.warning("pending", "closing the Raft connection of %s, the oldest of %s that have not proved "
                         "the cluster secret yet", victim.peer, rule)
        self._unknownConnections.discard(victim)
        victim.disconnect()

    def _onTick(self):
        super()._onTick()
        now = monotonicTime()
        if isinstance(self._server, LinkServer):
            self._server.resume(now)
        if now - self._last_sweep < self.SWEEP_S:
            return
        self._last_sweep = now
        for conn in list(self._unknownConnections) + list(self._connections.values()):
            why = conn.expired(now) if isinstance(conn, Link) else None
            if why is not None:
                self.link_counters["expired"] += 1
                log.info("closing the Raft connection of %s: %s", conn.peer, why)
                self._unknownConnections.discard(conn)
                conn.disconnect()

    def _onIncomingMessageReceived(self, conn, message):
        if isinstance(message, str) and (conn.sendRandKey or not self._syncObj.encryptor):
            reverse = message.startswith(REVERSE_LINK)
            address = message[len(REVERSE_LINK):] if reverse else message
            node = self._nodeAddrToNode.get(address)
            if node is None and address != "readonly":
                self._take_outside(conn, address)
                return
            if reverse:
                self._unknownConnections.discard(conn)  # this node lists the dialler: it connects itself
                conn.disconnect()
                return
            old = self._connections.get(node)
            super()._onIncomingMessageReceived(conn, message)
            if old is not None and old is not conn and old in self._reverse:
                self._reverse.discard(old)  # the peer's own link replaces this node's reverse one
                old.disconnect()  # out of the map: its callback finds no node for it
            return
        super()._onIncomingMessageReceived(conn, message)

    def _sendSelfAddress(self, conn):
        if conn in self._reverse:
            conn.send(REVERSE_LINK + self._selfNode.address)
            return
        super()._sendSelfAddress(conn)

    def _connectIfNecessarySingle(self, node):
        if super()._connectIfNecessarySingle(node):
            return True
        if self._shouldConnect(node) or node in self._preventConnectNodes or node not in self._nodes:
            return False
        now = monotonicTime()
        since = self._linkless_since.setdefault(node, now)
        conf = self._syncObj.conf
        # At most once a connection_timeout: a member that lists this node closes the link (it connects itself).
        if now - since < conf.connectionTimeout or now - self._lastConnectAttempt.get(node, -1e18) < \
                conf.connectionTimeout:
            return False
        self._lastConnectAttempt[node] = now
        old = self._connections.get(node)
        if old is not None:
            self._reverse.discard(old)
        conn = self._new_link()
        conn.encryptor = self._syncObj.encryptor
        conn.setOnConnectedCallback(functools.partial(self._onOutgoingConnected, conn))
        conn.setOnMessageReceivedCallback(functools.partial(self._onMessageReceived, node))
        conn.setOnDisconnectedCallback(functools.partial(self._onDisconnected, conn))
        self._connections[node] = conn
        self._reverse.add(conn)
        return conn.connect(node.ip, node.port)

    def _onNodeConnected(self, node):
        self._linkless_since.pop(node, None)
        super()._onNodeConnected(node)

    def send(self, node, message):
        # pysyncobj's looks the connection up again after sending: a send that fails closes it, and an outside
        # peer's connection is then out of the map (_onDisconnected): the second look-up raised KeyError.
        conn = self._connections.get(node)
        if conn is None or conn.state != CONNECTION_STATE.CONNECTED:
            return False
        conn.send(message)
        return conn.state == CONNECTION_STATE.CONNECTED

    def _outside(self) -> list:
        return [n for n in self._connections if n not in self._nodes]

    def _take_outside(self, conn, address: str) -> None:
        self._unknownConnections.discard(conn)
        try:
            node = type(self._selfNode)(address)
        except (ValueError, TypeError):
            log.warning("closing a Raft connection that names itself %r: not a host:port address", address[:100])
            conn.disconnect()
            return
        old = self._connections.pop(node, None)
        if old is not None:
            self._onNodeDisconnected(node)  # its callback finds no node for it once it is out of the map
            old.disconnect()
        if len(self._outside()) >= self.MAX_OUTSIDE:
            log.warning("closing the Raft connection of %s: %d links of peers outside this node's configuration "
                        "are open already", address, self.MAX_OUTSIDE)
            conn.disconnect()
            return
        self._connections[node] = conn
        conn.setOnMessageReceivedCallback(functools.partial(self._onMessageReceived, node))
        self._onNodeConnected(node)

    def _onDisconnected(self, conn):
        self._reverse.discard(conn)
        node = self._connToNode(conn)
        if node is not None and node not in self._nodes and node not in self._readonlyNodes:
            del self._connections[node]
            self._onNodeDisconnected(node)
            return
        super()._onDisconnected(conn)

    def addNode(self, node):
        conn = self._connections.get(node) if node not in self._nodes else None
        if conn is not None and self._shouldConnect(node):
            # Only the greater address of a pair connects, so no peer of this version opens such a link;
            # should one, pysyncobj's own connection replaces it.
            del self._connections[node]
            self._onNodeDisconnected(node)
            conn.disconnect()
            conn = None
        super().addNode(node)
        made = self._connections.get(node)
        if isinstance(made, TcpConnection):  # pysyncobj's own, for a node this one dials: a Link instead
            link = self._new_link()
            link.encryptor = made.encryptor
            link.setOnConnectedCallback(functools.partial(self._onOutgoingConnected, link))
            link.setOnMessageReceivedCallback(functools.partial(self._onMessageReceived, node))
            link.setOnDisconnectedCallback(functools.partial(self._onDisconnected, link))
            self._connections[node] = link
        if conn is not None:
            self._connections[node] = conn

    def destroy(self):
        outside = [self._connections.pop(n) for n in self._outside()]
        self._reverse.clear()
        super().destroy()
        for conn in outside:
            conn.disconnect()


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


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


class _Replicated(SyncObj):
    """SyncObj with the unsafe code paths replaced (see the module docstring).  The replacements are
    methods named as pysyncobj's private ones, so pysyncobj's own calls reach them."""

    def __init__(self, self_addr, partners, conf, transport_class, node: "RaftNode", node_class=TCPNode,
                 poller: LoopPoller | None = None):
        self._pq = node
        self._loop_poller = poller
        super().__init__(self_addr, partners, conf, transportClass=transport_class, nodeClass=node_class)

    # pysyncobj creates its own poller in ``__init__``; a node driven by its asyncio loop hands it the
    # loop's (``quorum.looppoller``) before its transport and pipe subscribe to it.
    @property
    def _poller(self):
        return self.__dict__["_pq_poller"]

    @_poller.setter
    def _poller(self, value):
        self.__dict__["_pq_poller"] = self._loop_poller if self._loop_poller is not None else value

    def _applyCommand(self, command, callback, commandType=None):
        """pysyncobj's, without its pipe when called on the loop that drives this node (from another
        thread, the pipe wakes the loop).  The command is queued; a leader then appends and sends it at
        once (``RaftNode.propose_now``), any other node at its tick in the loop's next pass."""
        if self._loop_poller is None or not self._pq.on_loop_thread():
            return SyncObj._applyCommand(self, command, callback, commandType)
        try:
            if commandType is not None:
                command = _syncobj_module._bchr(commandType) + command
            self._SyncObj__commandsQueue.put_nowait((command, callback))
        except queue.Full:
            self._SyncObj__callErrCallback(FAIL_REASON.QUEUE_FULL, callback)
            return
        if self._SyncObj__raftState == _LEADER and self._SyncObj__transport.ready:
            self._pq.propose_now()
        else:
            self._pq.wake()

    def propose_entry(self, payload: bytes, callback) -> None:
        """``apply_entry(payload)`` replicated: the command pysyncobj's ``@replicated`` wrapper makes (the
        method's number and its arguments, pickled), but pickled with protocol 4 (``MessagePickle``), where
        the wrapper's protocol 2 sends the payload's bytes through ``_codecs.encode``.  Every version
        unpickles either when it applies the entry (pysyncobj's ``pickle.loads``)."""
        func_id = self._methodToID[self._getFuncName("apply_entry")]
        command = MessagePickle.dumps((func_id, (payload,)))
        self._applyCommand(command, callback, _syncobj_module._COMMAND_TYPE.REGULAR)

    @replicated
    def apply_entry(self, payload):
        # pysyncobj increments raftLastApplied after this returns, so the index
        # of the entry being applied is raftLastApplied + 1, on replay too.
        return self._pq._apply(self.raftLastApplied + 1, bytes(payload))

    # ------------------------------------------------------------- the tick
    def _SyncObj__applyLogEntries(self):
        """pysyncobj's apply, without its immediate AppendEntries after each commit.

        pysyncobj answers "send AppendEntries now" whenever it applied something, so every committed
        entry cost a second round of messages (an AppendEntries carrying only the new commit index to
        each follower, and each follower's acknowledgement: half of the messages of an entry, each
        pickled, compressed and encrypted).  The followers learn the commit index from the next
        entry's AppendEntries instead, or at the latest ``COMMIT_NOTIFY_S`` later: the next heartbeat is
        brought forward to then.  Only when followers apply changes (reads they serve: ACLs,
        transactions to complete); what the leader commits, applies and answers does not.
        """
        applied = SyncObj._SyncObj__applyLogEntries(self)
        if applied and self._SyncObj__raftState == _LEADER:
            self._SyncObj__newAppendEntriesTime = min(self._SyncObj__newAppendEntriesTime,
                                                      _clock() + COMMIT_NOTIFY_S)
        return False

    def _SyncObj__onNodeDisconnected(self, node):
        """The leader's connection closed: campaign within half the minimum election timeout, not the whole.

        A leader killed or crashed has its connections closed by its kernel at once; a live leader's
        connection closes only after ``connection_timeout`` without a byte, beyond any election timeout, so
        this adds no election where there would have been none.  The draw spreads the followers' campaigns
        (both see the same close), as the election timeout's does; a node held back never campaigns
        (``_onTick``).  Only when an election starts changes, never what a vote or a commit needs."""
        SyncObj._SyncObj__onNodeDisconnected(self, node)
        if (node == self._SyncObj__raftLeader and self._SyncObj__raftState == _FOLLOWER
                and not self._SyncObj__transferInProgress):
            soon = _clock() + self._SyncObj__conf.raftMinTimeout / 2 * _syncobj_module.random.random()
            self._SyncObj__raftElectionDeadline = min(self._SyncObj__raftElectionDeadline, soon)

    def _onTick(self, timeToWait=0.0):
        if self._pq.restricted:
            # A node that may have lost acknowledged entries never stands for election.
            self._SyncObj__raftElectionDeadline = _clock() + self._SyncObj__generateRaftTimeout()
        super()._onTick(timeToWait)

    # ------------------------------------------------------ replaced: messages
    def _checkCommandsToApply(self):
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
        if self._SyncObj__raftState == _LEADER:
            return SyncObj._checkCommandsToApply(self)
        pending = self._SyncObj__commandsQueue
        while True:
            try:
                _, callback = pending.get_nowait()
            except queue.Empty:
                return
            if isinstance(callback, tuple):  # a command another node forwarded (a node of an earlier version)
                node, request_id = callback
                self._SyncObj__transport.send(node, {"type": "apply_command_response", "request_id": request_id,
                                                     "error": FAIL_REASON.NOT_LEADER})
            elif callback is not None:
                callback(None, FAIL_REASON.NOT_LEADER)

    def _SyncObj__onMessageReceived(self, node, message):
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == "apply_command":
            # A command another node forwarded (only a node of an earlier version forwards): generated on
            # that node's state, which may be stale; refused (see _checkCommandsToApply).
            if "request_id" in message:
                self._SyncObj__transport.send(node, {"type": "apply_command_response",
                                                     "request_id": message["request_id"],
                                                     "error": FAIL_REASON.REQUEST_DENIED})
            return
        if (kind != "append_entries" and node not in self._SyncObj__otherNodes
                and not (kind == "request_vote" and self._pq.restricted and self._may_vote(message))):
            # Outside this node's configuration: only a leader's AppendEntries are taken (see _Gate.dropNode),
            # and the vote a held-back node may give (_may_vote): a candidate that holds its target holds what
            # it waits for, and may be the only one (a member added since, whose entry is not in this node's
            # log yet, while the other members wait for its log too).  Raft servers vote for candidates outside
            # their configuration (thesis 4.1); other nodes keep out a removed member's campaigns.
            return
        if kind == "append_entries":
            self._append_entries(node, message)
            return
        if kind in ("request_vote", "response_vote") and self._stale_term(node, message):
            return
        if kind in ("request_vote", "timeout_now") and self._pq.restricted and not self._may_vote(message):
            self._withhold(node, message)
            return
        if kind == "response_vote" and not self._new_voter(node, message):
            return
        if kind == "next_node_idx":
            term = message.get("term", self._SyncObj__raftCurrentTerm)
            if _is_int(term) and term > self._SyncObj__raftCurrentTerm:
                # Raft: a response with a higher term deposes this node (pysyncobj only looks at the terms of
                # requests: a follower in a higher term that never campaigns, a recovering one, was never heard).
                self._SyncObj__setCurrentTerm(term, None)
                self.step_down()
                return
            if term != self._SyncObj__raftCurrentTerm:
                return  # an acknowledgement from another term (delayed): it says nothing about this leader's log
        SyncObj._SyncObj__onMessageReceived(self, node, message)
        if (kind == "next_node_idx" and message.get("success") and self._SyncObj__raftState == _LEADER):
            match = self._SyncObj__raftMatchIndex.get(node)
            entry = self._pq.journal.entry(match) if match else None
            if entry is not None:
                self._pq.identity.note_held(node.address, (entry[2], entry[1]))
            if not message.get("reset") and self._commits_nothing():
                self._pq.quiet += 1

    def _commits_nothing(self) -> bool:
        """No follower holds an entry beyond the commit index and every committed entry is applied: a tick
        now would change nothing that the next timed tick would not (``RaftNode._on_ready``)."""
        commit = self._SyncObj__raftCommitIndex
        return (self._SyncObj__raftLastApplied == commit
                and all(m <= commit for m in self._SyncObj__raftMatchIndex.values()))

    def _stale_term(self, node, message) -> bool:
        """Raft's terms on votes, which pysyncobj leaves out: a RequestVote from an earlier term is answered
        with this node's term (pysyncobj dropped it in silence), and such an answer makes the candidate a
        follower in that term.  Without it a candidate that missed a term (one that hears from nobody else
        in it: a view of the membership without the others) campaigned below the others' term forever,
        while they could elect nobody without it (found by the simulation, seed 102068).  A denial is a
        ``response_vote`` with ``granted`` false: an older node counts votes of its own term only, so it
        ignores one."""
        term, current = message.get("term"), self._SyncObj__raftCurrentTerm
        if not _is_int(term):
            return False
        if message.get("type") == "request_vote":
            if term >= current:
                return False
            self._SyncObj__transport.send(node, {"type": "response_vote", "term": current, "granted": False})
            return True
        if term > current:
            self._SyncObj__setCurrentTerm(term, None)
            self.step_down()
            return True
        return message.get("granted") is False

    def _new_voter(self, node, message) -> bool:
        """pysyncobj counts vote messages, not voters: a vote delivered twice would count twice (two
        leaders in one term).  Count each voter once per term."""
        term = self._SyncObj__raftCurrentTerm
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
        if message.get("type") != "request_vote" or not pq.vouched or pq.recovery is None:
            return False
        last = (message.get("last_log_term"), message.get("last_log_index"))
        return all(_is_int(x) for x in last) and last >= pq.recovery

    def _withhold(self, node, message) -> None:
        """A recovering node keeps up with terms but grants no vote and takes no leadership."""
        term = message.get("term")
        if _is_int(term) and term > self._SyncObj__raftCurrentTerm:
            self._SyncObj__setCurrentTerm(term, None)
            self._SyncObj__setState(_FOLLOWER)
            self._SyncObj__raftLeader = None
        self._pq.votes_withheld += 1

    def _append_entries(self, node, m) -> None:
        term, leader_commit = m.get("term"), m.get("commit_index")
        if not (_is_int(term) and _is_int(leader_commit)):
            log.warning("dropping a malformed AppendEntries from %s", node.address)
            return
        if term < self._SyncObj__raftCurrentTerm:
            if self._pq.restricted:
                # A node held back never campaigns, so nothing else would ever tell this leader of the higher
                # term it holds (from a run before it stopped): answer with it, the leader steps down and the
                # next election is in a term this node can follow (see next_node_idx above).
                self._SyncObj__transport.send(node, {
                    "type": "next_node_idx", "next_node_idx": self._pq.journal.durable_end()[1] + 1,
                    "reset": False, "success": False, "term": self._SyncObj__raftCurrentTerm})
            return  # a deposed leader
        # This node's leader in its term, as before the message: nothing about who leads changes.
        settled = (term == self._SyncObj__raftCurrentTerm and self._SyncObj__raftLeader == node
                   and self._SyncObj__raftState == _FOLLOWER)
        if term > self._SyncObj__raftCurrentTerm:
            self._SyncObj__transferInProgress = False  # a new leader supersedes any pending transfer
        if not self._SyncObj__transferInProgress:
            self._SyncObj__raftElectionDeadline = _clock() + self._SyncObj__generateRaftTimeout()
        if self._SyncObj__raftLeader != node:
            self._SyncObj__onLeaderChanged()
        self._SyncObj__raftLeader = node
        if term > self._SyncObj__raftCurrentTerm:
            self._SyncObj__setCurrentTerm(term, None)  # durable before anything below is acknowledged
        self._SyncObj__setState(_FOLLOWER)
        self._SyncObj__leaderCommitIndex = leader_commit
        if "prevLogIdx" in m:
            entries = m.get("entries", [])
            transmission = m.get("transmission")
            if transmission is not None:  # one entry too large for a message, in pieces
                if transmission == "start":
                    self._SyncObj__recvTransmission = m["data"]
                elif transmission == "process":
                    self._SyncObj__recvTransmission += m["data"]
                elif transmission == "finish":
                    entries = [_pickle.loads(self._SyncObj__recvTransmission + m["data"])]
                    self._SyncObj__recvTransmission = ""
                if transmission != "finish":
                    self._SyncObj__sendNextNodeIdx(node, success=False, reset=False)
                    return
            steady = self._match_and_append(node, m.get("prevLogIdx"), m.get("prevLogTerm"), entries, leader_commit)
            if steady and settled:
                self._pq.quiet_append()
        elif m.get("serialized") is not None:
            self._snapshot_chunk(node, term, m["serialized"])
        # A message without entries and without a snapshot chunk verifies nothing: the commit
        # index does not move (pysyncobj advanced it here, over entries it never matched).

    def _match_and_append(self, node, prev_idx, prev_term, entries, leader_commit) -> bool:
        """Raft's AppendEntries on a follower.  True when it appended (or held) every entry, cut nothing,
        changed no membership and acknowledged them as counted: the steady state."""
        journal = self._pq.journal
        if not (_is_int(prev_idx) and _is_int(prev_term) and isinstance(entries, (list, tuple))
                and all(isinstance(e, (list, tuple)) and len(e) == 3 and _is_int(e[1]) and _is_int(e[2])
                        and e[1] == prev_idx + 1 + i for i, e in enumerate(entries))):
            log.warning("dropping a malformed AppendEntries from %s", node.address)
            return False
        last = journal.entries[-1][1]
        prev = journal.entry(prev_idx)
        if prev is None:  # beyond our log (or below its start): resume from our end
            self._reply(node, last + 1, verified=False)
            return False
        if prev[2] != prev_term:
            self._reply(node, prev_idx, verified=False)
            return False
        # Raft 5.3: skip what we hold; cut only at the first entry that conflicts.
        new, steady = [], True
        for i, e in enumerate(entries):
            held = journal.entry(e[1])
            if held is None:
                new = entries[i:]
                break
            if held[2] != e[2]:
                if e[1] <= self._SyncObj__raftCommitIndex:
                    self._pq.diverged(e[1], e[2], held)
                self._rollback_membership(e[1])
                dropped = journal.truncate_from(e[1])
                log.info("AppendEntries from %s conflicts at index %d (term %d here, %d from the leader): "
                         "cut %d uncommitted entries", node.address, e[1], held[2], e[2], dropped)
                new, steady = entries[i:], False
                break
        dynamic = self._SyncObj__conf.dynamicMembershipChange
        for command, idx, eterm in new:
            command = bytes(command)
            journal.add(command, idx, eterm)
            if dynamic:
                change = self._SyncObj__parseChangeClusterRequest(command)
                if change is not None:
                    self._SyncObj__doChangeCluster(change)
                    steady = False
        verified = entries[-1][1] if entries else prev_idx
        commit = min(leader_commit, verified)
        if commit > self._SyncObj__raftCommitIndex:
            self._SyncObj__raftCommitIndex = commit
            journal.setRaftCommitIndex(commit)  # syncs first
        return self._reply(node, verified + 1, verified=True) and steady

    def _rollback_membership(self, from_index: int) -> None:
        if not self._SyncObj__conf.dynamicMembershipChange:
            return
        journal = self._pq.journal
        for entry in reversed([e for e in journal.entries if e[1] >= from_index]):
            change = self._SyncObj__parseChangeClusterRequest(entry[0])
            if change is not None:
                self._SyncObj__doChangeCluster(change, reverse=True)

    def _reply(self, node, next_index: int, verified: bool) -> bool:
        """Acknowledge up to ``next_index - 1`` (durable first), or ask the leader to resume there.
        A recovering node's acknowledgements are sent as the latter: they move the leader's send
        position but never count toward a majority.  True when the acknowledgement counts."""
        self._pq.journal.sync()
        self._pq.check_recovery()
        counted = verified and not self._pq.restricted
        # pysyncobj's acknowledgement, plus the term it answers (the leader ignores any other term's).
        self._SyncObj__transport.send(node, {"type": "next_node_idx", "next_node_idx": next_index,
                                            "reset": not counted, "success": counted,
                                            "term": self._SyncObj__raftCurrentTerm})
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
        commit = self._SyncObj__raftCommitIndex
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
        self._SyncObj__raftLastApplied = last
        if self._SyncObj__raftCommitIndex < last:
            self._SyncObj__raftCommitIndex = last
            self._pq.journal.setRaftCommitIndex(last)
        waiting = self._SyncObj__commandsWaitingCommit
        for idx in sorted(i for i in waiting if i <= last):
            for _term, callback in waiting.pop(idx):
                callback(None, FAIL_REASON.UNKNOWN_OUTCOME)  # overtaken by the snapshot: outcome unknown
        if self._SyncObj__conf.dynamicMembershipChange:
            me = self._SyncObj__selfNode.address
            node_class = self._SyncObj__nodeClass
            self._SyncObj__updateClusterConfiguration([node_class(a) for a in snap.cluster if a != me])
        self._SyncObj__onSetCodeVersion(0)
        self._SyncObj__needLoadDumpFile = False

    def adopt_log_configuration(self, after_index: int) -> int:
        """At start: apply the membership changes in the journal after ``after_index`` (the snapshot).

        Raft: a server uses the latest configuration in its log, committed or not, and pysyncobj does so
        for entries it appends.  But on a restart it rebuilds membership from the snapshot and then only
        from entries as they are committed, and the durable commit index is a hint written once a second:
        a restarted node did not know members added just before it stopped, could not connect to them,
        and so could not hear a leader or a verdict from them.  Applying a change twice is a no-op
        (pysyncobj re-applies committed ones).  Returns how many changes were applied."""
        if not self._SyncObj__conf.dynamicMembershipChange:
            return 0
        applied = 0
        for command, index, _term in list(self._pq.journal.entries):
            if index <= after_index:
                continue
            change = self._SyncObj__parseChangeClusterRequest(command)
            if change is not None and self._SyncObj__doChangeCluster(change):
                applied += 1
        return applied

    def _SyncObj__loadDumpFile(self, clearJournal):
        raise AssertionError("snapshot loading is the adapter's (load_snapshot); pysyncobj's would clear the journal")

    def _SyncObj__tryLogCompaction(self):
        pq = self._pq
        conf = self._SyncObj__conf
        now = _clock()
        if (not self._SyncObj__forceLogCompaction and len(pq.journal) <= conf.logCompactionMinEntries
                and now - pq.last_compaction <= conf.logCompactionMinTime):
            return
        self._SyncObj__forceLogCompaction = False
        pq.last_compaction = now
        applied = self._SyncObj__raftLastApplied
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
        members = [self._SyncObj__selfNode.address] + [n.address for n in self._SyncObj__otherNodes]
        if not self._SyncObj__conf.dynamicMembershipChange:
            return members
        later = []
        for command, entry_index, _term in reversed(self._pq.journal.entries):
            if entry_index <= index:
                break
            change = self._SyncObj__parseChangeClusterRequest(command)
            if change is not None:
                later.append((change[0], str(change[1])))  # (kind, the node's id: its address)
        return configuration_before(members, later[::-1])

    def config_index(self) -> int:
        """The log index of this node's configuration: its latest membership entry, else the first index of
        its journal (the configuration its snapshot recorded, or the one it was started with)."""
        entries = self._pq.journal.entries
        for command, entry_index, _term in reversed(entries):
            if self._SyncObj__parseChangeClusterRequest(command) is not None:
                return entry_index
        return entries[0][1] if entries else 0

    # ------------------------------------------------------------ recovery
    def step_down(self) -> None:
        if self._SyncObj__raftState != _FOLLOWER:
            self._SyncObj__setState(_FOLLOWER)
            self._SyncObj__raftLeader = None

    def forget_match(self, node) -> None:
        """``node`` restarted: what it acknowledged before may be gone; count only new acknowledgements."""
        if node in self._SyncObj__raftMatchIndex:
            self._SyncObj__raftMatchIndex[node] = 0

    def no_vote_this_term(self) -> None:
        if self._SyncObj__votedForNodeId is None:
            self._SyncObj__setCurrentTerm(self._SyncObj__raftCurrentTerm, RECOVERED_VOTE)

    def current_term(self) -> int:
        return self._SyncObj__raftCurrentTerm

    def vouched_term(self, term: int) -> None:
        """The vouchers' highest term: this node may have voted in it (or below) in a run whose record
        it lost, so it casts no vote up to that term (durable before anything else)."""
        if term > self._SyncObj__raftCurrentTerm:
            self._SyncObj__setCurrentTerm(term, RECOVERED_VOTE)
            self.step_down()
        else:
            self.no_vote_this_term()


class RaftNode:
    """A running Raft member.

    ``on_apply(index, term, payload) -> result`` is called for every committed entry,
    in order, on the thread that ticks Raft.  ``snapshot_state() -> records`` and
    ``restore_state(records, last_index)`` turn the state into records and back.
    ``disk`` and ``failstop`` are the node's storage and its way to stop, ``transport_class`` the
    pysyncobj transport under the identity gate (TCP by default), ``node_class`` pysyncobj's node
    type (``TCPNode``), ``clock`` what gives wall time (``time``); tests and the simulator pass their
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
                 node_class: type = TCPNode, trust_own_log: bool = False,
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
        self.last_compaction = _clock()
        self.votes_withheld = 0
        self.unverified_dropped = 0
        self._verified: dict[str, bool | str] = {}  # peer raft address -> True, or why it was refused
        self._welcomed: dict[str, bool] = {}  # peer raft address -> its verdict on this node arrived
        self.peer_clients: dict[str, str] = {}  # peer raft address -> client address (from its hello)
        self._nudged: dict[str, float] = {}
        self._outside: dict[str, tuple] = {}  # raft address -> (node, hello) of an admitted peer outside the config
        self._refusal_logged: dict[str, float] = {}
        self._calls: queue.SimpleQueue = queue.SimpleQueue()  # closures to run at the next tick
        self._loop = loop
        self._loop_thread = threading.get_ident() if loop is not None else None
        self._tick_soon: asyncio.Handle | None = None
        self._tick_timer: asyncio.TimerHandle | None = None
        self._stopping = False
        self.messages_read = 0  # messages read from peers (``_Gate``)
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
        conf = SyncObjConf(
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

        class Transport(_Gate, transport_class or _TcpTransport):
            owner = node
            limits = raft.link_limits()

        self._transport_holder: list = []

        def make_transport(*args, **kwargs):
            t = Transport(*args, **kwargs)
            self._transport_holder.append(t)
            return t

        with _pending_lock:
            _pending_journals[self.journal_path] = self.journal
            _pending_stores[self.snapshot_path] = _SnapshotShim(self.store, conf.logCompactionBatchSize)
        self._poller = LoopPoller(loop, self._on_ready) if loop is not None else None
        try:
            self._obj = _Replicated(self_addr, partners, conf, make_transport, self, node_class, self._poller)
        except SyncObjException as e:
            raise OSError(f"cannot bind the Raft port {bind_addr or self_addr}: {e.errorCode}") from None
        finally:
            with _pending_lock:
                _pending_journals.pop(self.journal_path, None)
                _pending_stores.pop(self.snapshot_path, None)
        self._transport = self._transport_holder[0]
        if snap is not None:
            self._obj.load_snapshot(snap)
        self._obj._SyncObj__needLoadDumpFile = False
        changes = self._obj.adopt_log_configuration(snap.last_index if snap is not None else 0)
        if changes:
            log.info("start-up: %d membership change(s) in the journal applied (members: %s)", changes,
                     ", ".join(self.members()))
        self._ping_interval = raft.peer_ping_interval
        self._last_ping = 0.0
        self._last_flush = _clock()
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
        if read and self._obj._SyncObj__raftState == _LEADER:
            self._loop_tick()
            return
        self.wake()

    def quiet_append(self) -> None:
        """A follower took an AppendEntries from its leader in its term, appended every entry, cut nothing,
        changed no membership and acknowledged them (``_Replicated._match_and_append``): its tick can wait,
        to apply what is committed within ``FOLLOWER_APPLY_S``."""
        self.quiet += 1
        obj = self._obj
        if self._apply_due is None and obj._SyncObj__raftCommitIndex > obj.raftLastApplied:
            self._apply_due = _clock() + FOLLOWER_APPLY_S

    def propose_now(self) -> None:
        """The leader appends the commands queued on its loop and sends them to its followers now, then
        starts its own sync: what its next tick would do first, without the rest of that tick.

        A proposal's tick was half of the leader's ticks, and all of it but this part (the commit
        index, the step-down check, the apply, the timers, the pings) waits for the tick that the first
        acknowledgement brings, a round trip later, or the timed one.  Nothing is skipped in between
        that the entry needs: ``_checkCommandsToApply`` is pysyncobj's own step (it appends at the
        leader's next index in its term, registers the callback and sends the AppendEntries), and
        ``start_sync`` is ``_on_tick``'s, so the entry's durability is as before (``_Gate``): nothing is
        committed before its sync is collected."""
        if not self._stopping:
            self._guarded(self._propose_now)

    def _propose_now(self) -> None:
        self._obj._checkCommandsToApply()
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
        self.journal.start_sync()  # the leader's entries sent this tick: durable while it reads acks (see _Gate)
        self.check_vouched()  # (the membership may have shrunk)
        self.check_recovery()
        while True:
            try:
                call = self._calls.get_nowait()
            except queue.Empty:
                break
            call()
        now = _clock()
        if now - self._last_ping >= self._ping_interval:
            self._last_ping = now
            ping = {"type": "pq_ping", "log": list(self.journal.durable_end())}
            for node in [*self._obj.otherNodes, *(n for n, _ in self._outside.values())]:
                self._transport.send_unsynced(node, ping)
        if now - self._last_flush >= 1.0:
            self._last_flush = now
            self.identity.flush()
        leader = self._obj._getLeader()
        if leader != self._last_leader:
            self._last_leader = leader
            if leader is not None:
                self.leader_changes += 1
            self.leader_changed.set()

    def tick_wait(self) -> float:
        """How long the node may wait for messages before its next tick: a tick period, or less
        when the leader owes its followers an AppendEntries sooner (a new commit index: _Replicated), a
        follower's election deadline comes sooner or it has committed entries to apply (``quiet_append``)."""
        obj = self._obj
        now = _clock()
        wait = self._tick_period
        if self._apply_due is not None and obj._SyncObj__raftCommitIndex > obj.raftLastApplied:
            wait = min(wait, max(self._apply_due - now, 0.0))  # what a follower learned is committed (quiet_append)
        if obj._SyncObj__raftState == _LEADER:
            return min(wait, max(obj._SyncObj__newAppendEntriesTime - now, 0.0))
        # A follower or candidate wakes for its election deadline, not at the next tick after it: the
        # followers of a lost leader campaign at the instants they drew (``_SyncObj__onNodeDisconnected``), so
        # they do not split the vote by falling due in the same tick.  (A deadline already past: the tick
        # about to run starts the election, or this node reaches nobody and has nothing to wake for.)
        remaining = obj._SyncObj__raftElectionDeadline - now
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
                        _fmt(new), _fmt(self.journal.durable_end()))
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
        return self._needed({self.self_addr, *(n.address for n in self._obj.otherNodes)})

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
        own = frozenset({self.self_addr, *(n.address for n in self._obj.otherNodes)})
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
        verdict in this run: then the node reaches the highest log end and ``held`` they reported before it
        counts, and casts no vote up to their highest term (a vote of a lost run may be missing from its
        files)."""
        if self.vouched:
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
        self.vouched = True
        if have:
            self._obj.vouched_term(max(self._vouchers[a][1] for a in have))
        targets = [t for a in have if (t := self._vouchers[a][0]) is not None]
        top = max(targets) if targets else None
        log.info("vouched for by %s (log end %s, theirs up to %s)", ", ".join(have), _fmt(self.journal.durable_end()),
                 _fmt(top) if top else "-")
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
                        "start (%s): what lies above it was never committed", _fmt(self.recovery), _fmt(lowered),
                        ", ".join(have))
            self.journal.set_recovery_target(lowered)
            self.recovery, self.recovery_reason = lowered, (
                f"the peers that vouched for this start ({', '.join(have)}) hold {_fmt(lowered)}")
            self.check_recovery()
        if top is not None:
            self.adopt_target(top, f"the peers that vouched for this start ({', '.join(have)}) hold "
                                   f"{_fmt(top)}: a restored copy would lack what it acknowledged")

    def check_recovery(self) -> None:
        if self.recovery is None or self.journal.durable_end() < self.recovery:
            return
        self._obj.no_vote_this_term()  # a vote in this term may have been lost with the log: cast none
        self.journal.set_recovery_target(None)
        log.warning("caught up to %s (log now %s): this node votes and counts toward a majority again",
                    _fmt(self.recovery), _fmt(self.journal.durable_end()))
        self.recovery = self.recovery_reason = None

    # -------------------------------------------------------------- identity
    def hello_message(self) -> dict:
        message = self.identity.hello.message(self.journal.durable_end())
        if self.link_master is not None and linkcrypto.OFFERED:
            message["codecs"] = list(linkcrypto.OFFERED)  # an earlier version ignores the field
        return message

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
        now = _clock()
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
        member = any(n.address == address for n in self._obj.otherNodes)
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
        if verdict.new_run:
            self._obj.forget_match(node)
        if verdict.recover is not None:
            log.warning("%s started with its log at %s, below %s it was seen to hold: it must catch up before it "
                        "votes or counts toward a majority", address, _fmt(hello.log_end), _fmt(verdict.recover))
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
        return {"members": self.members(), "index": at, "committed": self._obj.raftCommitIndex >= at}

    def _refuse(self, node, reason: str) -> None:
        address = node.address
        self._verified[address] = reason
        self._outside.pop(address, None)
        now = _clock()
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
        if isinstance(vouch, dict) and not self.vouched:
            ends = [vouch.get("log_end"), vouch.get("held")]
            term = vouch.get("term")
            if _is_int(term) and term >= 0 and all(e is None or (isinstance(e, (list, tuple)) and len(e) == 2 and all(
                    _is_int(x) and x >= 0 for x in e)) for e in ends):
                # Its log end, not what it saw this node hold: see check_vouched.
                self._vouchers[node.address] = (tuple(ends[0]) if ends[0] is not None else None, term)
                if ends[0] is None:
                    self._unknown_ends.add(node.address)
                config = vouch.get("config")  # an earlier version sends none
                if (isinstance(config, dict) and _is_int(config.get("index")) and config["index"] >= 0
                        and isinstance(config.get("members"), list) and 0 < len(config["members"]) <= MAX_MEMBERS
                        and all(isinstance(a, str) and 0 < len(a) <= 300 for a in config["members"])):
                    self._voucher_configs[node.address] = (frozenset(config["members"]), config["index"],
                                                           config.get("committed") is True)
                elif config is not None:
                    log.warning("ignoring a malformed configuration in the vouch of %s: %r", node.address,
                                str(config)[:200])
            else:
                log.warning("ignoring a malformed vouch from %s: %r", node.address, vouch)
        elif vouch is None and not self.vouched:
            self._vouchers[node.address] = (None, 0)  # an older version's verdict: its recover target below
            self._unknown_ends.add(node.address)
        target = message.get("recover")
        if target is not None and self._peers_vouched:
            log.info("%s saw this node hold %r in an earlier run; the peers that vouched for this start set its "
                     "target already", node.address, target)
        elif target is not None:
            if not (isinstance(target, (list, tuple)) and len(target) == 2 and all(_is_int(x) and x >= 0
                                                                                     for x in target)):
                log.warning("ignoring a malformed verdict from %s: recover=%r", node.address, target)
                return
            self.adopt_target(tuple(target), f"{node.address} saw this node hold {_fmt(tuple(target))}")
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
        if isinstance(pos, (list, tuple)) and len(pos) == 2 and all(_is_int(x) and x >= 0 for x in pos):
            self.identity.note_held(node.address, (pos[0], pos[1]))

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
        self._call(lambda cb: self._on_raft_thread(lambda: self._obj.transferLeadership(address, callback=cb)),
                   timeout)

    # ------------------------------------------------------------- proposals
    def propose(self, payload: bytes, on_done: Callable[[Any, Exception | None], None]) -> None:
        """Submit an entry; ``on_done(result, None)`` after it is applied here, or
        ``on_done(None, ProposalRejected|ProposalUnknown)``.  Called from any thread."""

        def callback(result, error):
            if error == FAIL_REASON.SUCCESS:
                on_done(result, None)
            elif error in _DEFINITE:
                on_done(None, ProposalRejected(_DEFINITE[error]))
            else:
                on_done(None, ProposalUnknown(f"outcome unknown (pysyncobj reason {error})"))

        self._obj.propose_entry(payload, callback)

    # ---------------------------------------------------------------- status
    def status(self) -> dict[str, Any]:
        s = self._obj.getStatus()
        leader = s.get("leader")
        peers = {}
        is_leader = s["state"] == _LEADER
        for node in self._obj.otherNodes:
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
        state, leader, term = obj._SyncObj__raftState, obj._SyncObj__raftLeader, obj._SyncObj__raftCurrentTerm
        return state == _LEADER, (leader.address if leader is not None else None), term

    # What the simulator and tests read and do without reaching into the Raft object (callbacks get
    # (result, error): error 0 is success, anything else pysyncobj's FAIL_REASON number).
    @property
    def is_leader(self) -> bool:
        return self._obj._SyncObj__raftState == _LEADER

    @property
    def raft_term(self) -> int:
        """The term this node is in now (``current_term``: the one it made durable)."""
        return self._obj._SyncObj__raftCurrentTerm

    @property
    def voted_for(self):
        """Whom this node voted for in ``raft_term`` (None: nobody yet)."""
        return self._obj._SyncObj__votedForNodeId

    @property
    def commit_index(self) -> int:
        return self._obj._SyncObj__raftCommitIndex

    @property
    def last_applied(self) -> int:
        return self._obj._SyncObj__raftLastApplied

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
            obj._SyncObj__transport.destroy()
        finally:
            notifier = getattr(obj, "_SyncObj__pipeNotifier", None)
            if notifier is not None:
                for fd in (notifier._PipeNotifier__pipeR, notifier._PipeNotifier__pipeW):
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


def _fmt(pos) -> str:
    if pos is None:
        return "nothing"
    term, index = pos
    return f"term {term} index {'?' if index >= UNKNOWN_INDEX else index}"
