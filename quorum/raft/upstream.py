"""pysyncobj, pinned: the one module of pidquorum that imports it or names anything private of it.

Its private state and steps are reached here only, under plain names (``Core``, ``TransportHooks``,
``TcpTransportCore``) that the rest of the package reads and overrides.  ``OVERRIDDEN`` and ``USED`` hold a
digest of every upstream function replaced or relied on, checked by ``tests/quorum/test_upstream.py``
(``docs/durability.md``: how an upgrade goes).  What is replaced, and why:

=====================================  ============================================  ==============================
pysyncobj code replaced                why                                           replaced by
=====================================  ============================================  ==============================
``createJournal``: an mmap journal,    acknowledged entries lost on power loss       ``quorum.journal`` (handed over
never fsync'd                                                                        by path: ``hand_over``)
``Serializer`` (snapshots), its        written and renamed without fsync; a stop     ``snapshots.store`` via
``__loadDumpFile`` and                 between its two steps makes the next start    ``SnapshotShim``;
``__tryLogCompaction``                 ``clear()`` the journal: committed entries    ``Replicated.try_compaction``,
                                       erased                                        ``files.reconcile``
``__onMessageReceived``:               cut after every prevLogIdx even where         ``Replicated.on_message``:
AppendEntries                          entries match; commit index advanced over     Raft 5.3 (cut at the first
                                       entries never verified (a snapshot chunk, a   conflict only), commit to what
                                       heartbeat); no answer to a vote request of    the message verified, terms on
                                       a lower term; votes counted per message;      votes and acknowledgements,
                                       acknowledgements without their term;          votes counted per voter,
                                       requests from outside the configuration;      the recovery gate, every
                                       a higher term taken from any vote request     vote request answered with
                                                                                     the term; check-quorum's
                                                                                     lease (``_in_lease``)
``__applyLogEntries``                  an AppendEntries round after every commit     the commit index rides the
                                       (half of the messages of an entry)            next heartbeat (``COMMIT_NOTIFY_S``)
``_checkCommandsToApply``,             a command submitted on a follower is          refused there (NOT_LEADER): a
``_applyCommand``                      forwarded to the leader: a batch generated    batch is generated on the
                                       on a deposed leader's stale state is          leader's state; no pipe on the
                                       committed                                     loop's own thread
``__onNodeDisconnected``               a killed leader is noticed only at the        campaign within half the
                                       election timeout                              minimum election timeout
``_onTick``                            a node that may have lost acknowledged        never stands for election
                                       entries stands for election; a node back      while held back; pre-vote
                                       from a partition campaigns in a higher term   first, then the campaign
                                       and deposes a healthy leader                  (``Replicated._campaign``)
``_poller``                            a thread and a ``select.poll`` of its own     the node's asyncio loop
                                                                                     (``quorum.looppoller``)
``TCPTransport``: links only nodes     a node never hears a member its log does      ``TcpTransport``: a link when
that list each other; binds 0.0.0.0;   not list yet; the Raft port open on every     either lists the other; bind
``TcpConnection`` buffers whatever     interface; a stream without the secret costs  the advertised host;
length a peer announces                a leader its leadership                       ``quorum.raftlink``
tick catches every exception           a failed fsync is forgotten and the next      ``RaftNode._guarded``:
                                       sync is a no-op                               fail-stop
=====================================  ============================================  ==============================
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import inspect
import queue
import random
import threading
from typing import Any, Callable

import pysyncobj.pickle as _pickle
import pysyncobj.syncobj as _syncobj_module
import pysyncobj.transport as _transport_module
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated
from pysyncobj.config import SERIALIZER_STATE
from pysyncobj.monotonic import monotonic as _monotonic
from pysyncobj.node import TCPNode
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.syncobj import SyncObjException
from pysyncobj.tcp_connection import CONNECTION_STATE, TcpConnection
from pysyncobj.transport import TCPTransport, Transport, TransportNotReadyError

from .. import looppoller, raftlink

PINNED = "0.3.17"
VERSION = importlib.metadata.version("pysyncobj")
if VERSION != PINNED:  # pragma: no cover - only with another pysyncobj installed by hand
    raise ImportError(f"pysyncobj {VERSION} is installed; pidquorum runs pysyncobj {PINNED} only (quorum/raft/"
                      f"upstream.py overrides its internals: an upgrade means re-reading them, see its docstring)")
if (POLL_EVENT_TYPE.READ, POLL_EVENT_TYPE.WRITE, POLL_EVENT_TYPE.ERROR) != (looppoller.READ, looppoller.WRITE,
                                                                             looppoller.ERROR):  # pragma: no cover
    raise ImportError("pysyncobj's poller events differ from quorum.looppoller's")
if (CONNECTION_STATE.DISCONNECTED, CONNECTION_STATE.CONNECTING, CONNECTION_STATE.CONNECTED) != (
        raftlink.DISCONNECTED, raftlink.CONNECTING, raftlink.CONNECTED):  # pragma: no cover
    raise ImportError("pysyncobj's connection states differ from quorum.raftlink's")

FOLLOWER, CANDIDATE, LEADER = 0, 1, 2  # pysyncobj's _RAFT_STATE

# Outcomes a proposal's callback gets (pysyncobj's FAIL_REASON).
SUCCESS = FAIL_REASON.SUCCESS
NOT_LEADER = FAIL_REASON.NOT_LEADER
REQUEST_DENIED = FAIL_REASON.REQUEST_DENIED
UNKNOWN_OUTCOME = FAIL_REASON.UNKNOWN_OUTCOME
QUEUE_FULL = FAIL_REASON.QUEUE_FULL
DEFINITE = {FAIL_REASON.QUEUE_FULL: "queue full", FAIL_REASON.MISSING_LEADER: "no leader",
            FAIL_REASON.DISCARDED: "discarded by a new leader", FAIL_REASON.NOT_LEADER: "not the leader",
            FAIL_REASON.REQUEST_DENIED: "request denied"}  # definitely not applied

Config = SyncObjConf
ConfigError = SyncObjException
TransportNotReady = TransportNotReadyError
Node = TCPNode
UpstreamConnection = TcpConnection  # pysyncobj's own connection: what ``raftlink.Link`` speaks to
unpickle = _pickle.loads  # how an entry sent in pieces is read back (pysyncobj's pickle)


def source_digest(fn: Callable) -> str:
    return hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()[:16]


# (upstream function, digest of its source at PINNED).  Replaced: pidquorum's code runs instead.
OVERRIDDEN = {
    "syncobj.createJournal": (_syncobj_module.createJournal, "9ea9e463ae2a0b8b"),
    "serializer.Serializer": (_syncobj_module.Serializer, "b5577a63525f536d"),
    "SyncObj.__onMessageReceived": (SyncObj._SyncObj__onMessageReceived, "ddfe34b6c0282179"),
    "SyncObj.__applyLogEntries": (SyncObj._SyncObj__applyLogEntries, "073db677773b5a2d"),
    "SyncObj.__onNodeDisconnected": (SyncObj._SyncObj__onNodeDisconnected, "a81c0475ba2218cc"),
    "SyncObj.__tryLogCompaction": (SyncObj._SyncObj__tryLogCompaction, "c2f8a0ec14cc7312"),
    "SyncObj.__loadDumpFile": (SyncObj._SyncObj__loadDumpFile, "ec66e83905de703b"),
    "SyncObj._checkCommandsToApply": (SyncObj._checkCommandsToApply, "a386a8079361d204"),
    "SyncObj._applyCommand": (SyncObj._applyCommand, "827f207d515b2d64"),
    "SyncObj._onTick": (SyncObj._onTick, "cc9eb08232d005ba"),
    "TCPTransport._createServer": (TCPTransport._createServer, "df2c7dd8d54c6083"),
    "TCPTransport.tryGetReady": (TCPTransport.tryGetReady, "1e05defa41268c22"),
    "TCPTransport._onNewIncomingConnection": (TCPTransport._onNewIncomingConnection, "27812f1826cd78ad"),
    "TCPTransport._onTick": (TCPTransport._onTick, "86a1722daf4d6c48"),
    "TCPTransport._onIncomingMessageReceived": (TCPTransport._onIncomingMessageReceived, "8b7217b0cc17c96d"),
    "TCPTransport._sendSelfAddress": (TCPTransport._sendSelfAddress, "89a3f0837e9df82b"),
    "TCPTransport._connectIfNecessarySingle": (TCPTransport._connectIfNecessarySingle, "e2cdb479552abdea"),
    "TCPTransport._onDisconnected": (TCPTransport._onDisconnected, "ecba8d76dfc385fe"),
    "TCPTransport.addNode": (TCPTransport.addNode, "8245fa6ac3ac9f36"),
    "TCPTransport.dropNode": (TCPTransport.dropNode, "3f49cac8c4fdb650"),
    "TCPTransport.send": (TCPTransport.send, "2fd6c84b8621427d"),
    "TCPTransport.destroy": (TCPTransport.destroy, "a5ef3f4054aff1f0"),
    "Transport._onNodeConnected": (Transport._onNodeConnected, "1de5fe11e3840eba"),
    "Transport._onNodeDisconnected": (Transport._onNodeDisconnected, "0e7c826aace4f85f"),
    "Transport._onMessageReceived": (Transport._onMessageReceived, "c3e908d4e1c7ee9b"),
}
# Called or read, not replaced: what pidquorum's code relies on them doing.
USED = {
    "SyncObj.__setCurrentTerm": (SyncObj._SyncObj__setCurrentTerm, "0ad5bf456ac06bd3"),
    "SyncObj.__setState": (SyncObj._SyncObj__setState, "2c1f239f7bd79b39"),
    "SyncObj.__generateRaftTimeout": (SyncObj._SyncObj__generateRaftTimeout, "92ed37d3620e781a"),
    "SyncObj.__sendNextNodeIdx": (SyncObj._SyncObj__sendNextNodeIdx, "68aaeefc267b8896"),
    "SyncObj.__parseChangeClusterRequest": (SyncObj._SyncObj__parseChangeClusterRequest, "b2d5d695b12e592f"),
    "SyncObj.__doChangeCluster": (SyncObj._SyncObj__doChangeCluster, "247d4d4101b8cd3c"),
    "SyncObj.__updateClusterConfiguration": (SyncObj._SyncObj__updateClusterConfiguration, "e2de42f3d1a46c96"),
    "SyncObj.__onSetCodeVersion": (SyncObj._SyncObj__onSetCodeVersion, "17b050edb193c853"),
    "SyncObj.__onLeaderChanged": (SyncObj._SyncObj__onLeaderChanged, "53b7685e1d897887"),
    "SyncObj.__onBecomeLeader": (SyncObj._SyncObj__onBecomeLeader, "5a3fd97bc17dc1cf"),
    "SyncObj.__callErrCallback": (SyncObj._SyncObj__callErrCallback, "6037c14ef64c2763"),
    "SyncObj._getFuncName": (SyncObj._getFuncName, "0e8b7603c15fc578"),
    "SyncObj.__init__": (SyncObj.__init__, "09df12cd7fd7d727"),
    "SyncObj.getStatus": (SyncObj.getStatus, "0d3d668f66239ee0"),
    "SyncObj.__sendAppendEntries": (SyncObj._SyncObj__sendAppendEntries, "9cb9073128c392fa"),
    "SyncObj.__connectedToAnyone": (SyncObj._SyncObj__connectedToAnyone, "acd40e9e3ac6c4cc"),
    "SyncObj.__getCurrentLogIndex": (SyncObj._SyncObj__getCurrentLogIndex, "e5af22ca246686bd"),
    "SyncObj.__getCurrentLogTerm": (SyncObj._SyncObj__getCurrentLogTerm, "1cb8867e6a13d397"),
    "TCPTransport.__init__": (TCPTransport.__init__, "4f0eef9cc5c06f5e"),
    "TCPTransport._shouldConnect": (TCPTransport._shouldConnect, "45eab7664e7caa39"),
    "TCPTransport._onOutgoingConnected": (TCPTransport._onOutgoingConnected, "b5d72590358c9987"),
    "TCPTransport._connToNode": (TCPTransport._connToNode, "20f678ef338665c9"),
}


def clock() -> float:
    """pysyncobj's clock (``driven_by`` replaces it)."""
    return _syncobj_module.monotonicTime()


def jitter() -> float:
    """A draw in [0, 1) from pysyncobj's generator (``driven_by`` replaces it)."""
    return _syncobj_module.random.random()


_driven = threading.Lock()


@contextlib.contextmanager
def driven_by(now: Callable[[], float], rng: random.Random):
    """Inside the block every node of this process reads ``now`` as its clock and draws its election
    timeouts from ``rng`` (the simulator's world).  pysyncobj reads both from module globals, so one
    world per process."""
    if not _driven.acquire(blocking=False):
        raise RuntimeError("a simulated world is already driving this process")
    saved = (_syncobj_module.monotonicTime, _syncobj_module.random, _transport_module.monotonicTime)
    _syncobj_module.monotonicTime = _transport_module.monotonicTime = now
    _syncobj_module.random = rng
    try:
        yield
    finally:
        _syncobj_module.monotonicTime, _syncobj_module.random, _transport_module.monotonicTime = saved
        _driven.release()


# ---------------------------------------------------------------------------------------------------------
# Construction: SyncObj.__init__ calls the module-level createJournal and Serializer of pysyncobj.syncobj;
# the node's own journal and snapshot store are handed over by path (``hand_over``), anything else left alone.
_pending_lock = threading.Lock()
_pending_journals: dict[str, Any] = {}
_pending_stores: dict[str, "SnapshotShim"] = {}
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


class SnapshotShim:
    """pysyncobj's Serializer interface over ``snapshots.store.SnapshotStore``.  The leader's replication
    loop still asks it for chunks to send; everything that writes or loads a snapshot is pidquorum's."""

    def __init__(self, store, batch_bytes: int):
        self.store = store
        self.batch_bytes = batch_bytes

    def checkSerializing(self):
        return SERIALIZER_STATE.NOT_SERIALIZING, None

    def getTransmissionData(self, node):
        return self.store.chunk(node, self.batch_bytes)

    def cancelTransmisstion(self, node):  # (sic) pysyncobj's name
        self.store.cancel(node)

    def serialize(self, *args, **kwargs):
        raise AssertionError("compaction is pidquorum's (RaftNode.compact)")

    def deserialize(self, *args, **kwargs):
        raise AssertionError("snapshot loading is pidquorum's (Replicated.load_snapshot)")

    def setTransmissionData(self, *args, **kwargs):
        raise AssertionError("snapshot install is pidquorum's (Replicated.snapshot_chunk)")


@contextlib.contextmanager
def hand_over(journal_path: str, journal, snapshot_path: str, store, chunk_bytes: int):
    """While a ``Core`` is constructed inside the block, it takes ``journal`` and ``store`` as its own."""
    with _pending_lock:
        _pending_journals[journal_path] = journal
        _pending_stores[snapshot_path] = SnapshotShim(store, chunk_bytes)
    try:
        yield
    finally:
        with _pending_lock:
            _pending_journals.pop(journal_path, None)
            _pending_stores.pop(snapshot_path, None)


def _field(name: str, doc: str) -> property:
    attr = "_SyncObj__" + name

    def get(self):
        return getattr(self, attr, None)  # (None until SyncObj.__init__ sets it: it walks dir(self) before)

    def set_(self, value):
        setattr(self, attr, value)
    return property(get, set_, doc=doc)


def _routed(plain: str) -> Callable:
    """A private hook of pysyncobj's that calls the plain-named method ``plain`` (a subclass's override, else
    the default: pysyncobj's own step) with the hook's arguments, and passes its result back."""
    def hook(self, *args):
        return getattr(self, plain)(*args)
    hook.__name__ = hook.__qualname__ = f"routed_to_{plain}"
    return hook


class Core(SyncObj):
    """pysyncobj's SyncObj, its private state and steps under plain names, its private hooks routed to
    plain methods a subclass overrides (``on_message``, ``apply_log_entries``, ``on_node_disconnected``,
    ``check_commands``, ``try_compaction``, ``on_tick``); each default is pysyncobj's own step."""

    state = _field("raftState", "FOLLOWER, CANDIDATE or LEADER")
    term = _field("raftCurrentTerm", "the current term")
    voted_for = _field("votedForNodeId", "whom this node voted for in ``term`` (None: nobody yet)")
    leader = _field("raftLeader", "the leader's node, as this node knows it (None: none)")
    commit_index = _field("raftCommitIndex", "")
    last_applied = _field("raftLastApplied", "")
    leader_commit_index = _field("leaderCommitIndex", "the commit index the leader last announced")
    match_index = _field("raftMatchIndex", "the leader's view: node -> highest index it acknowledged")
    next_index = _field("raftNextIndex", "the leader's view: node -> the index it sends that node next")
    election_deadline = _field("raftElectionDeadline", "when this node campaigns if it hears no leader")
    transfer_in_progress = _field("transferInProgress", "a leadership transfer is under way")
    next_append_time = _field("newAppendEntriesTime", "when the leader sends its next AppendEntries")
    force_compaction = _field("forceLogCompaction", "")
    need_load_dump = _field("needLoadDumpFile", "")
    commands_queue = _field("commandsQueue", "commands submitted, not yet appended")
    waiting_commit = _field("commandsWaitingCommit", "index -> [(term, callback)] of appended commands")
    transport = _field("transport", "")
    configuration = _field("conf", "pysyncobj's SyncObjConf")
    self_node = _field("selfNode", "")
    other_nodes = _field("otherNodes", "the other members (a set of nodes)")
    node_class = _field("nodeClass", "")
    votes_count = _field("votesCount", "votes a candidate has counted in its term")
    pipe_notifier = _field("pipeNotifier", "the pipe that wakes pysyncobj's poll from another thread")

    def __init__(self, self_addr, partners, conf, transport_class, node_class=TCPNode, poller=None):
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

    @property
    def poller(self):
        return self._poller

    # ------------------------------------------------------------------------ pysyncobj's steps, named
    def set_term(self, term: int, voted_for) -> None:
        """Term and vote, written to the journal's meta (durable before any message leaves: the gate)."""
        self._SyncObj__setCurrentTerm(term, voted_for)

    def set_state(self, state: int) -> None:
        self._SyncObj__setState(state)

    def election_timeout(self) -> float:
        """A fresh randomized election timeout (from pysyncobj's generator)."""
        return self._SyncObj__generateRaftTimeout()

    def connected_to_anyone(self) -> bool:
        """pysyncobj's condition for a campaign: a link to another member is up, or there is none."""
        return self._SyncObj__connectedToAnyone()

    def last_log(self) -> tuple[int, int]:
        """(index, term) of the last entry of this node's log (pysyncobj's __getCurrentLogIndex/Term)."""
        return self._SyncObj__getCurrentLogIndex(), self._SyncObj__getCurrentLogTerm()

    def become_leader(self) -> None:
        self._SyncObj__onBecomeLeader()

    def leader_changed(self) -> None:
        self._SyncObj__onLeaderChanged()

    def send_next_node_idx(self, node, success: bool, reset: bool) -> None:
        self._SyncObj__sendNextNodeIdx(node, success=success, reset=reset)

    def parse_membership(self, command: bytes):
        """(kind, node) if ``command`` is a membership entry, else None."""
        return self._SyncObj__parseChangeClusterRequest(command)

    def change_membership(self, change, reverse: bool = False) -> bool:
        return self._SyncObj__doChangeCluster(change, reverse=reverse)

    def set_configuration(self, nodes: list) -> None:
        self._SyncObj__updateClusterConfiguration(nodes)

    def set_code_version(self, version: int) -> None:
        self._SyncObj__onSetCodeVersion(version)

    def fail_callback(self, reason, callback) -> None:
        self._SyncObj__callErrCallback(reason, callback)

    def pipe_descriptors(self) -> tuple[int, ...]:
        notifier = self.pipe_notifier
        return () if notifier is None else (notifier._PipeNotifier__pipeR, notifier._PipeNotifier__pipeW)

    def queue_command(self, command: bytes, callback, command_type=None) -> bool:
        """Queue a command without pysyncobj's pipe (the caller wakes the loop).  False if the queue is full."""
        if command_type is not None:
            command = _syncobj_module._bchr(command_type) + command
        try:
            self.commands_queue.put_nowait((command, callback))
        except queue.Full:
            self.fail_callback(FAIL_REASON.QUEUE_FULL, callback)
            return False
        return True

    def upstream_apply_command(self, command, callback, command_type=None):
        return SyncObj._applyCommand(self, command, callback, command_type)

    def method_id(self, name: str) -> int:
        """The number pysyncobj's ``@replicated`` gives a method (the first element of its command)."""
        return self._methodToID[self._getFuncName(name)]

    REGULAR = _syncobj_module._COMMAND_TYPE.REGULAR

    # ------------------------------------------------------------------------ hooks, routed
    _SyncObj__onMessageReceived = _routed("on_message")
    _SyncObj__applyLogEntries = _routed("apply_log_entries")
    _SyncObj__onNodeDisconnected = _routed("on_node_disconnected")
    _SyncObj__tryLogCompaction = _routed("try_compaction")
    _checkCommandsToApply = _routed("check_commands")
    _onTick = _routed("on_tick")
    _applyCommand = _routed("apply_command")

    def _SyncObj__loadDumpFile(self, clearJournal):
        raise AssertionError("snapshot loading is pidquorum's (Replicated.load_snapshot); pysyncobj's would clear "
                             "the journal")

    # ------------------------------------------------------------------------ their defaults: pysyncobj's steps
    def on_message(self, node, message) -> None:
        SyncObj._SyncObj__onMessageReceived(self, node, message)

    def apply_log_entries(self):
        return SyncObj._SyncObj__applyLogEntries(self)

    def on_node_disconnected(self, node) -> None:
        SyncObj._SyncObj__onNodeDisconnected(self, node)

    def try_compaction(self) -> None:
        raise NotImplementedError

    def check_commands(self) -> None:
        SyncObj._checkCommandsToApply(self)

    def on_tick(self, time_to_wait: float) -> None:
        SyncObj._onTick(self, time_to_wait)

    def apply_command(self, command, callback, command_type=None):
        return SyncObj._applyCommand(self, command, callback, command_type)


replicated_method = replicated  # pysyncobj's decorator: a method applied on every node in log order


class TransportHooks:
    """What a transport reports to its node, routed to plain methods (``node_connected``,
    ``node_disconnected``, ``message_received``) that a subclass overrides; each default is pysyncobj's.
    Mixed into pysyncobj's transports (``MessageTransport``, ``TcpTransportCore``)."""

    _onNodeConnected = _routed("node_connected")
    _onNodeDisconnected = _routed("node_disconnected")
    _onMessageReceived = _routed("message_received")

    def node_connected(self, node) -> None:
        Transport._onNodeConnected(self, node)

    def node_disconnected(self, node) -> None:
        Transport._onNodeDisconnected(self, node)

    def message_received(self, node, message) -> None:
        Transport._onMessageReceived(self, node, message)

    @property
    def syncobj(self):
        return getattr(self, "_syncObj", None)

    def connection(self, node):
        """``node``'s TCP connection (None on a transport without one: the simulator's)."""
        return getattr(self, "_connections", {}).get(node)


class MessageTransport(TransportHooks, Transport):
    """The interface a transport gives a node (pysyncobj's ``Transport``): the simulator implements it over
    its network.  It calls ``node_connected``, ``node_disconnected`` and ``message_received``, and
    implements ``send``, ``addNode``, ``dropNode`` and ``destroy``."""


def _tfield(attr: str, doc: str = "") -> property:
    def get(self):
        return getattr(self, attr)

    def set_(self, value):
        setattr(self, attr, value)
    return property(get, set_, doc=doc)


class TcpTransportCore(TransportHooks, TCPTransport):
    """pysyncobj's TCP transport, its private state and steps under plain names, its private hooks routed to
    plain methods (each default pysyncobj's own)."""

    connections = _tfield("_connections", "node -> connection")
    unknown_connections = _tfield("_unknownConnections", "incoming connections that have not named their node")
    address_nodes = _tfield("_nodeAddrToNode", "address -> node, for the members and read-only nodes")
    members = _tfield("_nodes", "the member nodes this transport links")
    readonly_nodes = _tfield("_readonlyNodes")
    own_node = _tfield("_selfNode")
    server = _tfield("_server")
    no_connect = _tfield("_preventConnectNodes", "nodes never to dial")
    last_connect_attempt = _tfield("_lastConnectAttempt", "node -> when it was last dialled")

    def should_connect(self, node) -> bool:
        """pysyncobj's rule: only the greater address of a pair dials."""
        return self._shouldConnect(node)

    def node_of(self, conn):
        return self._connToNode(conn)

    def outgoing_connected(self, conn) -> None:
        self._onOutgoingConnected(conn)

    # hooks, routed
    _createServer = _routed("create_server")
    _onNewIncomingConnection = _routed("incoming_connection")
    _onTick = _routed("transport_tick")
    _onIncomingMessageReceived = _routed("incoming_message")
    _sendSelfAddress = _routed("send_self_address")
    _connectIfNecessarySingle = _routed("connect_if_necessary")
    _onDisconnected = _routed("disconnected")

    # their defaults: pysyncobj's steps
    def create_server(self) -> None:
        TCPTransport._createServer(self)

    def incoming_connection(self, conn) -> None:
        TCPTransport._onNewIncomingConnection(self, conn)

    def transport_tick(self) -> None:
        TCPTransport._onTick(self)

    def incoming_message(self, conn, message) -> None:
        TCPTransport._onIncomingMessageReceived(self, conn, message)

    def send_self_address(self, conn) -> None:
        TCPTransport._sendSelfAddress(self, conn)

    def connect_if_necessary(self, node) -> bool:
        return TCPTransport._connectIfNecessarySingle(self, node)

    def disconnected(self, conn) -> None:
        TCPTransport._onDisconnected(self, conn)

    def on_message_of(self, node) -> Callable:
        """The callback a connection to ``node`` calls with each message."""
        return lambda message: self._onMessageReceived(node, message)

    def on_disconnect_of(self, conn) -> Callable:
        return lambda: self._onDisconnected(conn)

    def on_outgoing_connected_of(self, conn) -> Callable:
        return lambda: self._onOutgoingConnected(conn)
