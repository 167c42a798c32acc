"""The Raft port: pysyncobj's TCP transport over ``quorum.raftlink``'s bounded connections, with a link
between two nodes whenever either lists the other, and the limits that need the whole port."""
from __future__ import annotations

import logging
import os

from ..raftlink import CONNECTED, Link, LinkLimits, LinkServer, refusals
from .upstream import TcpTransportCore, TransportNotReady, clock

log = logging.getLogger(__name__)


# How a reverse link names its dialler: an earlier version, which takes no such link, reads it as an address it
# does not list and closes the connection (it would otherwise take it as the peer's own link, and after it closed
# reconnect through a connection object that cannot dial: a link lost until a restart).
REVERSE_LINK = "pq-reverse:"


class TcpTransport(TcpTransportCore):
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
      (``RaftNode._on_hello``), and ``Replicated`` takes only a leader's AppendEntries from it.  When a
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
        conf = self.syncobj.conf
        return Link(self.syncobj.poller, self.limits, None, conf.connectionTimeout, conf.sendBufferSize,
                    conf.recvBufferSize, conf.tcp_keepalive, counters=self.link_counters)

    def create_server(self):
        conf = self.syncobj.conf
        host, port = conf.bindAddress.rsplit(":", 1)  # RaftNode always gives one (the advertised address)
        self.server = LinkServer(self.syncobj.poller, host.strip("[]"), int(port), self.incoming_connection,
                                  self.limits, conf.connectionTimeout, conf.sendBufferSize, conf.recvBufferSize,
                                  conf.tcp_keepalive, self.link_counters)

    def tryGetReady(self):
        # pysyncobj gives up binding after maxBindRetries with TransportNotReadyError, which its SyncObj logs
        # with a traceback and turns into SyncObjException('BindError'): the address and the reason are
        # lost.  Raise the one line a node stops with (quorum.node: exit 69) before that.
        try:
            super().tryGetReady()
        except TransportNotReady:
            error = getattr(self.server, "bind_error", None)
            reason = (os.strerror(error.errno) if error is not None and error.errno else str(error or "bind failed"))
            raise OSError(f"cannot bind the Raft port {self.syncobj.conf.bindAddress}: {reason}") from None

    def incoming_connection(self, conn):
        super().incoming_connection(conn)
        pending = [c for c in self.unknown_connections if not c.authenticated and c is not conn]
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
        self.unknown_connections.discard(victim)
        victim.disconnect()

    def transport_tick(self):
        super().transport_tick()
        now = clock()
        if isinstance(self.server, LinkServer):
            self.server.resume(now)
        if now - self._last_sweep < self.SWEEP_S:
            return
        self._last_sweep = now
        for conn in list(self.unknown_connections) + list(self.connections.values()):
            why = conn.expired(now) if isinstance(conn, Link) else None
            if why is not None:
                self.link_counters["expired"] += 1
                log.info("closing the Raft connection of %s: %s", conn.peer, why)
                self.unknown_connections.discard(conn)
                conn.disconnect()

    def incoming_message(self, conn, message):
        if isinstance(message, str) and (conn.sendRandKey or not self.syncobj.encryptor):
            reverse = message.startswith(REVERSE_LINK)
            address = message[len(REVERSE_LINK):] if reverse else message
            node = self.address_nodes.get(address)
            if node is None and address != "readonly":
                self._take_outside(conn, address)
                return
            if reverse:
                self.unknown_connections.discard(conn)  # this node lists the dialler: it connects itself
                conn.disconnect()
                return
            old = self.connections.get(node)
            super().incoming_message(conn, message)
            if old is not None and old is not conn and old in self._reverse:
                self._reverse.discard(old)  # the peer's own link replaces this node's reverse one
                old.disconnect()  # out of the map: its callback finds no node for it
            return
        super().incoming_message(conn, message)

    def send_self_address(self, conn):
        if conn in self._reverse:
            conn.send(REVERSE_LINK + self.own_node.address)
            return
        super().send_self_address(conn)

    def connect_if_necessary(self, node):
        if super().connect_if_necessary(node):
            return True
        if self.should_connect(node) or node in self.no_connect or node not in self.members:
            return False
        now = clock()
        since = self._linkless_since.setdefault(node, now)
        conf = self.syncobj.conf
        # At most once a connection_timeout: a member that lists this node closes the link (it connects itself).
        if now - since < conf.connectionTimeout or now - self.last_connect_attempt.get(node, -1e18) < \
                conf.connectionTimeout:
            return False
        self.last_connect_attempt[node] = now
        old = self.connections.get(node)
        if old is not None:
            self._reverse.discard(old)
        conn = self._new_link()
        conn.encryptor = self.syncobj.encryptor
        self._wire(conn, node)
        self.connections[node] = conn
        self._reverse.add(conn)
        return conn.connect(node.ip, node.port)

    def _wire(self, conn, node) -> None:
        conn.setOnConnectedCallback(self.on_outgoing_connected_of(conn))
        conn.setOnMessageReceivedCallback(self.on_message_of(node))
        conn.setOnDisconnectedCallback(self.on_disconnect_of(conn))

    def node_connected(self, node):
        self._linkless_since.pop(node, None)
        super().node_connected(node)

    def send(self, node, message):
        # pysyncobj's looks the connection up again after sending: a send that fails closes it, and an outside
        # peer's connection is then out of the map (_onDisconnected): the second look-up raised KeyError.
        conn = self.connections.get(node)
        if conn is None or conn.state != CONNECTED:
            return False
        conn.send(message)
        return conn.state == CONNECTED

    def _outside(self) -> list:
        return [n for n in self.connections if n not in self.members]

    def _take_outside(self, conn, address: str) -> None:
        self.unknown_connections.discard(conn)
        try:
            node = type(self.own_node)(address)
        except (ValueError, TypeError):
            log.warning("closing a Raft connection that names itself %r: not a host:port address", address[:100])
            conn.disconnect()
            return
        old = self.connections.pop(node, None)
        if old is not None:
            self.node_disconnected(node)  # its callback finds no node for it once it is out of the map
            old.disconnect()
        if len(self._outside()) >= self.MAX_OUTSIDE:
            log.warning("closing the Raft connection of %s: %d links of peers outside this node's configuration "
                        "are open already", address, self.MAX_OUTSIDE)
            conn.disconnect()
            return
        self.connections[node] = conn
        conn.setOnMessageReceivedCallback(self.on_message_of(node))
        self.node_connected(node)

    def disconnected(self, conn):
        self._reverse.discard(conn)
        node = self.node_of(conn)
        if node is not None and node not in self.members and node not in self.readonly_nodes:
            del self.connections[node]
            self.node_disconnected(node)
            return
        super().disconnected(conn)

    def addNode(self, node):
        conn = self.connections.get(node) if node not in self.members else None
        if conn is not None and self.should_connect(node):
            # Only the greater address of a pair connects, so no peer of this version opens such a link;
            # should one, pysyncobj's own connection replaces it.
            del self.connections[node]
            self.node_disconnected(node)
            conn.disconnect()
            conn = None
        super().addNode(node)
        made = self.connections.get(node)
        if made is not None and not isinstance(made, Link):  # pysyncobj's own, for a node this one dials
            link = self._new_link()
            link.encryptor = made.encryptor
            self._wire(link, node)
            self.connections[node] = link
        if conn is not None:
            self.connections[node] = conn

    def destroy(self):
        outside = [self.connections.pop(n) for n in self._outside()]
        self._reverse.clear()
        super().destroy()
        for conn in outside:
            conn.disconnect()

