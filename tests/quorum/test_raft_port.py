"""The Raft port against peers without the cluster secret (``quorum.raftlink``, ``quorum.raft.TcpTransport``).

pysyncobj's connection buffered whatever a peer announced (0x7fffffff bytes streamed: a leader lost its
leadership), never closed a connection that sent nothing, and accepted one connection per readiness from a
backlog of 5.  Unit tests drive a ``Link`` over a socket pair with a poller of the test's; the others attack a
running cluster's port over loopback.
"""
from __future__ import annotations

import socket
import struct
import threading
import time

import pytest
from cryptography.fernet import Fernet

from quorum.raft import RaftConfig
from quorum.raft.upstream import UpstreamConnection as TcpConnection
from quorum.raftlink import DISCONNECTED, READ, Link, LinkLimits, LinkServer
from tests.support.inproc import SimCluster

LIMITS = LinkLimits(max_message_bytes=2**20, handshake_bytes=4096, handshake_timeout=0.5, read_per_event=65536)


class Poller:
    """pysyncobj's poller interface; the test calls ``fire`` for what would be ready."""

    def __init__(self):
        self.subs = {}

    def subscribe(self, fd, callback, mask):
        self.subs[fd] = (callback, mask)

    def unsubscribe(self, fd):
        self.subs.pop(fd, None)

    def fire(self, link: Link, event: int = READ) -> None:
        callback, _ = self.subs[link.fileno()]
        callback(link.fileno(), event)


def link_pair(limits: LinkLimits = LIMITS):
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    poller = Poller()
    link = Link(poller, limits, ours, timeout=5.0, peer="203.0.113.9:4000")
    closed = []
    link.setOnDisconnectedCallback(lambda: closed.append(True))
    received = []
    link.setOnMessageReceivedCallback(received.append)
    return link, theirs, poller, closed, received


def test_a_huge_announced_message_before_the_handshake_closes_the_connection_at_once():
    link, theirs, poller, closed, _ = link_pair()
    theirs.sendall(struct.pack("i", 0x7FFFFFFF) + b"x" * 60000)
    poller.fire(link)
    assert closed and link.state == DISCONNECTED
    assert len(link._rbuf) == 0


@pytest.mark.parametrize("size", [-1, -0x80000000, LIMITS.handshake_bytes + 1])
def test_a_negative_or_oversized_announcement_closes_it(size):
    link, theirs, poller, closed, _ = link_pair()
    theirs.sendall(struct.pack("i", size) + b"y" * 100)
    poller.fire(link)
    assert closed


def test_before_the_handshake_the_connection_holds_at_most_two_handshake_messages_whatever_is_streamed():
    link, theirs, poller, closed, _ = link_pair()
    theirs.setblocking(False)
    # A length within the limit, then far more than it: the message is refused once it is complete, and
    # nothing beyond two messages' worth was ever read into memory.
    try:
        theirs.send(struct.pack("i", 4000) + b"z" * 200_000)
    except BlockingIOError:
        pass
    poller.fire(link)
    assert closed and link.state == DISCONNECTED


def test_a_partial_message_is_held_within_the_bound_and_one_event_reads_at_most_read_per_event():
    limits = LinkLimits(max_message_bytes=2**20, handshake_bytes=4096, read_per_event=8192)
    link, theirs, poller, closed, _ = link_pair(limits)
    link.authenticated = True  # a peer that proved the secret: up to max_message_bytes per message
    theirs.setblocking(False)
    sent = 0
    payload = struct.pack("i", 500_000) + b"a" * 499_000
    while sent < len(payload):
        try:
            sent += theirs.send(payload[sent:])
        except BlockingIOError:
            break
    poller.fire(link)
    assert not closed and len(link._rbuf) <= 8192


def test_a_connection_that_never_proves_the_secret_expires_whether_it_sends_or_not():
    link, theirs, poller, closed, _ = link_pair()
    now = time.monotonic()
    assert link.expired(now) is None
    assert "cluster secret" in link.expired(now + LIMITS.handshake_timeout + 0.01)
    link.authenticated = True
    assert link.expired(now + LIMITS.handshake_timeout + 0.01) is None
    assert "nothing read" in link.expired(now + 5.1)


def fernet_pair():
    """A pysyncobj ``TcpConnection`` (a node of an earlier version) and a ``Link``, both with the secret."""
    key = Fernet.generate_key()
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    link_poller, old_poller = Poller(), Poller()
    link = Link(link_poller, LIMITS, a, timeout=5.0, peer="198.51.100.1:1")
    old = TcpConnection(poller=old_poller, socket=b, timeout=5.0)
    link.encryptor = Fernet(key)
    old.encryptor = Fernet(key)
    return link, old, link_poller, old_poller


def test_a_link_and_pysyncobjs_connection_read_each_others_messages_and_the_handshake_authenticates():
    link, old, link_poller, old_poller = fernet_pair()
    got_link, got_old = [], []
    link.setOnMessageReceivedCallback(got_link.append)
    old.setOnMessageReceivedCallback(got_old.append)
    # pysyncobj's handshake, as an incoming connection sees it: the dialler's random bytes first (proves
    # nothing: a recorded message replays), then everything carries this side's random bytes.
    old.recvRandKey = b"k" * 32
    old.send(old.recvRandKey)
    link_poller.fire(link)
    assert got_link == [b"k" * 32] and not link.authenticated
    link.sendRandKey, link.recvRandKey = b"k" * 32, b"e" * 32
    link.send(link.recvRandKey)
    old_poller.subs[old.fileno()][0](old.fileno(), READ)
    assert got_old == [b"e" * 32]
    old.sendRandKey = b"e" * 32
    entries = [(bytes(range(256)) * 40, 7, 2)]
    old.send({"type": "append_entries", "entries": entries})
    link_poller.fire(link)
    assert got_link[-1] == {"type": "append_entries", "entries": entries} and link.authenticated
    link.send({"type": "next_node_idx", "next_node_idx": 8})
    old_poller.subs[old.fileno()][0](old.fileno(), READ)
    assert got_old[-1] == {"type": "next_node_idx", "next_node_idx": 8}


def test_a_message_sealed_with_another_secret_or_replayed_into_the_handshake_closes_the_link():
    link, old, link_poller, _ = fernet_pair()
    old.encryptor = Fernet(Fernet.generate_key())
    closed = []
    link.setOnDisconnectedCallback(lambda: closed.append(True))
    old.send(b"d" * 32)
    link_poller.fire(link)
    assert closed
    # The right secret, but the second message lacks this connection's random bytes (a replay).
    link, old, link_poller, _ = fernet_pair()
    closed = []
    link.setOnDisconnectedCallback(lambda: closed.append(True))
    link.recvRandKey = b"e" * 32
    old.send(("not this connection's bytes", "127.0.0.1:1"))
    link_poller.fire(link)
    assert closed and not link.authenticated


def test_a_zlib_bomb_from_an_authenticated_peer_is_refused_within_the_bound():
    link, old, link_poller, _ = fernet_pair()
    closed = []
    link.setOnDisconnectedCallback(lambda: closed.append(True))
    link.authenticated = True
    old.send(b"\0" * (3 * LIMITS.max_message_bytes))  # deflates to a few KiB; inflates past the bound
    link_poller.fire(link)
    assert closed


# ---------------------------------------------------------------- against a running cluster
QUICK = RaftConfig(heartbeat_interval=0.02, election_timeout_min=0.5, election_timeout_max=1.0,
                   connection_timeout=1.5, reconnect_interval=0.05, peer_ping_interval=0.05,
                   leader_step_down_timeout=1.0, handshake_timeout=0.5, max_pending_connections=16,
                   max_pending_per_host=8)


def _raft_addr(node) -> tuple[str, int]:
    host, port = node.cfg.raft_address.rsplit(":", 1)
    return host, int(port)


def _closed_by_peer(sock: socket.socket, deadline: float) -> bool:
    """True once the node closed ``sock`` (EOF or reset), reading whatever it sent meanwhile."""
    sock.settimeout(0.05)
    while time.monotonic() < deadline:
        try:
            if sock.recv(65536) == b"":
                return True
        except socket.timeout:
            continue
        except OSError:
            return True
    return False


def test_a_leader_streamed_a_huge_message_closes_the_connection_and_keeps_its_term():
    with SimCluster(raft=QUICK) as c:
        epoch = c.register(1)
        leader = c.leader()
        term = leader.raft.current_term()
        attacker = socket.create_connection(_raft_addr(leader))
        attacker.sendall(struct.pack("i", 0x7FFFFFFF))
        stop = threading.Event()
        streamed = [0]

        def stream():
            chunk = b"\xab" * 65536
            try:
                while not stop.is_set():
                    streamed[0] += attacker.send(chunk)
            except OSError:
                pass

        t = threading.Thread(target=stream, daemon=True)
        t.start()
        t.join(5.0)
        stop.set()
        assert not t.is_alive(), "the node kept reading a message announced at 2 GiB"
        assert streamed[0] < 16 * 2**20
        c.allocate(1, epoch)
        assert c.leader() is leader and leader.raft.current_term() == term
        assert leader.raft.status()["raft_port"]["refused_messages"] >= 1  # counted (a metric)
        attacker.close()


@pytest.mark.parametrize("what", ["silent", "trickle", "truncated"])
def test_a_connection_that_does_not_prove_the_secret_is_closed_at_the_handshake_deadline(what):
    with SimCluster(raft=QUICK) as c:
        c.register(1)
        node = c.nodes[1]
        s = socket.create_connection(_raft_addr(node))
        opened = time.monotonic()
        if what == "truncated":
            s.sendall(struct.pack("i", 100) + b"t" * 50)  # half a message, then nothing
        elif what == "trickle":
            def trickle():  # a message announced at 1000 bytes, one byte at a time: never idle, never whole
                try:
                    for b in struct.pack("i", 1000) + b"s" * 100:
                        s.send(bytes([b]))
                        time.sleep(0.05)
                except OSError:
                    pass
            threading.Thread(target=trickle, daemon=True).start()
        assert _closed_by_peer(s, opened + 10.0), f"a {what} connection stayed open"
        s.close()


def test_a_flood_of_connections_is_accepted_and_shed_while_the_members_links_stay_and_allocations_commit():
    with SimCluster(raft=QUICK) as c:
        epoch = c.register(1)
        leader = c.leader()
        term = leader.raft.current_term()
        socks = []
        for _ in range(200):
            s = socket.socket()
            s.settimeout(2.0)
            s.connect(_raft_addr(leader))  # a backlog of 5 timed 25 of 200 out
            socks.append(s)
        transport = leader.raft._transport
        c.wait(lambda: leader.on_loop(lambda: transport.link_counters["refused_pending"]) >= 200 - 8,
               what="the connections over the per-host limit closed")
        assert leader.on_loop(lambda: len(transport.unknown_connections)) <= QUICK.max_pending_per_host
        c.allocate(1, epoch)
        assert leader.raft.current_term() == term
        for s in socks:
            s.close()


def test_the_listener_takes_at_most_accept_rate_connections_a_second_and_leaves_the_rest_queued():
    limits = LinkLimits(accept_rate=20.0, accept_burst=3, listen_backlog=64)
    poller, taken, counters = Poller(), [], {}
    server = LinkServer(poller, "127.0.0.1", 0, taken.append, limits, timeout=5.0, counters=counters)
    server.bind()
    port = server._socket.getsockname()[1]
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(10)]  # queued by the kernel
    try:
        fd = server._fileno
        callback, _ = poller.subs[fd]
        callback(fd, READ)
        assert len(taken) == 3 and fd not in poller.subs  # the burst, then off the loop
        server.resume(time.monotonic())
        assert fd not in poller.subs  # no token due yet
        deadline = time.monotonic() + 5.0
        while len(taken) < 10 and time.monotonic() < deadline:
            server.resume(time.monotonic())
            if fd in poller.subs:
                poller.subs[fd][0](fd, READ)
        assert len(taken) == 10 and counters["accept_pauses"] >= 2  # every queued one taken in turn, at the rate
        assert counters["accepted"] == 10
    finally:
        for c in clients:
            c.close()
        for link in taken:
            link.disconnect()
        server.unbind()
