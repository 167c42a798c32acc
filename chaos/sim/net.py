"""A simulated network between quorum nodes, and the pysyncobj transport that uses it.

Connections behave like the TCP links a node opens (``quorum.raft.TcpTransport``
over pysyncobj's): a link between two nodes exists while both run and either
lists the other (the other takes it even from outside its configuration), is
set up when both directions pass,
carries messages in order with a delay, and is closed when a node stops or when
one side has heard nothing for the connection timeout (a partition).  Messages of
a closed link are never delivered.  On top of that the seed's faults:

* **drop** a message, **duplicate** it, **reorder** it (deliver it out of order
  on its link), **delay** it (long tails);
* **partitions**: a set of blocked directions, symmetric or one-way.

Every message is pickled on send and unpickled on delivery (as over TCP, with the
link's ``MessagePickle``), so no two nodes share an object.  All randomness comes
from the simulation's generator.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any, Protocol

from quorum.linkcrypto import MessagePickle
from quorum.raft import MessageTransport, Node

from .host import Host


class _Votes(Protocol):
    def vote(self, voter: str, term, candidate: str) -> None: ...


class NetHost(Host, Protocol):
    """What the network uses of the simulation: the checker hears every vote sent; ``node_at`` is the
    node (a ``SimulatedNode``) at a raft address."""

    checker: _Votes

    def node_at(self, address: str) -> Any: ...


class StableNode(Node):
    """Raft's node (pysyncobj's TCP node) with a hash that does not depend on PYTHONHASHSEED, so the order in which
    pysyncobj walks its sets of nodes (and so sends messages) is the same in every process."""

    def __hash__(self):
        return zlib.crc32(self.id.encode())


@dataclass
class NetFaults:
    drop: float = 0.0          # probability a message is lost
    duplicate: float = 0.0     # probability a message is delivered twice
    reorder: float = 0.0       # probability a message ignores the link's order
    delay: tuple[float, float] = (0.0001, 0.002)   # seconds, uniform
    long_delay: float = 0.0    # probability of a delay of up to ``long_delay_max``
    long_delay_max: float = 1.5


@dataclass
class _Link:
    epoch: int
    a: str
    b: str
    heard: dict = field(default_factory=dict)      # address -> last time it received anything on this link
    last_at: dict = field(default_factory=dict)    # (src, dst) -> delivery time of the last in-order message


class SimNetwork:
    def __init__(self, sim: NetHost, faults: NetFaults, connection_timeout: float, reconnect_interval: float):
        self.sim = sim
        self.faults = faults
        self.connection_timeout = connection_timeout
        self.reconnect_interval = reconnect_interval
        self.endpoints: dict[str, "SimTransport"] = {}
        self.links: dict[frozenset, _Link] = {}
        self.blocked: set[tuple[str, str]] = set()
        self._epochs = 0
        self.sent = self.delivered = self.dropped = 0
        # AppendEntries seen leaving a node (``_note_append``): all, those that a batch limit cut short of
        # the sender's log end (or one piece of an entry too large for a message), and those whose commit
        # index is beyond the last entry they carry (what a follower may commit is what the message verified)
        self.appends = self.appends_split = self.appends_commit_beyond = 0

    # ----------------------------------------------------------- endpoints
    def attach(self, t: "SimTransport") -> None:
        self.endpoints[t.address] = t
        self.sim.note(f"net: {t.address} up")

    def detach(self, address: str) -> None:
        if self.endpoints.pop(address, None) is None:
            return
        for key in [k for k in self.links if address in k]:
            self._close(key, f"{address} stopped")

    def passable(self, src: str, dst: str) -> bool:
        return (src, dst) not in self.blocked

    def maintain(self) -> None:
        """Connect pairs that should be connected; close links that heard nothing for too long."""
        now = self.sim.clock.now
        for key, link in list(self.links.items()):
            for side in (link.a, link.b):
                if now - link.heard.get(side, now) > self.connection_timeout:
                    self._close(key, f"{side} heard nothing for {self.connection_timeout}s")
                    break
        addresses = sorted(self.endpoints)
        for i, a in enumerate(addresses):
            for b in addresses[i + 1:]:
                key = frozenset((a, b))
                if key in self.links:
                    continue
                ta, tb = self.endpoints[a], self.endpoints[b]
                if (b in ta.peers or a in tb.peers) and self.passable(a, b) and self.passable(b, a):
                    self._open(key, a, b)

    def _open(self, key: frozenset, a: str, b: str) -> None:
        self._epochs += 1
        now = self.sim.clock.now
        link = _Link(self._epochs, a, b, heard={a: now, b: now})
        self.links[key] = link
        self.sim.note(f"net: link {a} <-> {b} up (epoch {link.epoch})")
        for side, other in ((a, b), (b, a)):
            t = self.endpoints[side]
            t.connected(other)

    def _close(self, key: frozenset, why: str) -> None:
        link = self.links.pop(key, None)
        if link is None:
            return
        self.sim.note(f"net: link {link.a} <-> {link.b} down ({why})")
        for side, other in ((link.a, link.b), (link.b, link.a)):
            t = self.endpoints.get(side)
            if t is not None:
                t.disconnected(other)

    def forget(self, address: str, peer: str) -> None:
        """``address`` dropped ``peer`` from its membership: their link goes."""
        self._close(frozenset((address, peer)), f"{address} dropped {peer}")

    # ------------------------------------------------------------ messages
    def send(self, src: str, dst: str, message) -> bool:
        link = self.links.get(frozenset((src, dst)))
        if link is None:
            return False
        if type(message) is dict:
            kind = message.get("type")
            if kind == "append_entries":
                self._note_append(src, message)
            elif kind == "response_vote" and message.get("granted") is not False:
                self.sim.checker.vote(src, message.get("term"), dst)
        self.sent += 1
        f, rng = self.faults, self.sim.rng
        if not self.passable(src, dst) or rng.random() < f.drop:
            self.dropped += 1
            return True
        data = MessagePickle.dumps(message)
        copies = 2 if rng.random() < f.duplicate else 1
        for _ in range(copies):
            delay = rng.uniform(*f.delay)
            if rng.random() < f.long_delay:
                delay += rng.uniform(0, f.long_delay_max)
            at = self.sim.clock.now + delay
            if rng.random() >= f.reorder:
                at = max(at, link.last_at.get((src, dst), 0.0))
                link.last_at[(src, dst)] = at
            self.sim.schedule(at, "deliver", self._deliver, link.epoch, src, dst, data)
        return True

    def _note_append(self, src: str, m: dict) -> None:
        self.appends += 1
        if "prevLogIdx" not in m:
            return  # a snapshot chunk, or a message without entries: it verifies nothing
        if "transmission" in m:
            self.appends_split += 1  # one piece of an entry larger than the batch limit
            return
        entries = m.get("entries") or ()
        last = entries[-1][1] if entries else m["prevLogIdx"]
        sender = self.sim.node_at(src)
        if entries and sender is not None and sender.running and sender.raft.journal.entries[-1][1] > last:
            self.appends_split += 1
        if isinstance(m.get("commit_index"), int) and m["commit_index"] > last:
            self.appends_commit_beyond += 1

    def figures(self) -> dict:
        return {"append_entries": self.appends, "append_entries_split": self.appends_split,
                "append_entries_commit_beyond": self.appends_commit_beyond}

    def _deliver(self, epoch: int, src: str, dst: str, data: bytes) -> None:
        link = self.links.get(frozenset((src, dst)))
        t = self.endpoints.get(dst)
        if link is None or link.epoch != epoch or t is None:
            return  # the connection it was sent on is gone
        link.heard[dst] = self.sim.clock.now
        self.delivered += 1
        t.deliver(src, MessagePickle.loads(data))


class SimTransport(MessageTransport):
    """A node's transport (``quorum.raft.MessageTransport``) over ``SimNetwork`` (the node's identity gate is mixed in by
    ``RaftNode``).  ``network`` and ``node`` are set on a subclass made per node."""

    network: SimNetwork
    node: object  # the SimulatedNode, told when messages arrive (it ticks soon after)

    def __init__(self, syncObj, selfNode, otherNodes):
        super().__init__(syncObj, selfNode, otherNodes)
        self.address = selfNode.address
        self.peers: dict[str, object] = {n.address: n for n in otherNodes}
        self.outside: dict[str, object] = {}  # linked peers outside this node's configuration
        self._node_class = type(selfNode)
        self._connected: set[str] = set()
        self.network.attach(self)

    def _node(self, peer: str):
        return self.peers.get(peer) or self.outside.get(peer)

    def connected(self, peer: str) -> None:
        if peer in self._connected:
            return
        node = self.peers.get(peer)
        if node is None:
            node = self.outside[peer] = self._node_class(peer)
        self._connected.add(peer)
        self.node.guard(self.node_connected, node)

    def disconnected(self, peer: str) -> None:
        node = self._node(peer)
        if node is not None and peer in self._connected:
            self._connected.discard(peer)
            self.outside.pop(peer, None)
            self.node.guard(self.node_disconnected, node)

    def deliver(self, src: str, message) -> None:
        node = self._node(src)
        if node is None or src not in self._connected:
            return
        self.node.guard(self.message_received, node, message)
        self.node.wake()

    # ---------------------------------------------------- pysyncobj's side
    def send(self, node, message):
        if node.address not in self._connected:
            return False
        return self.network.send(self.address, node.address, message)

    def addNode(self, node):
        self.peers[node.address] = node
        self.outside.pop(node.address, None)  # its link, if up, is now a member's

    def dropNode(self, node):
        self.peers.pop(node.address, None)
        self._connected.discard(node.address)
        self.network.forget(self.address, node.address)

    def destroy(self):
        self.network.detach(self.address)
        self._connected.clear()
        self.outside.clear()
