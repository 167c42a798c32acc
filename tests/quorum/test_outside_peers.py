"""A link from a peer outside a node's configuration (``quorum.raft.TcpTransport``), over real TCP.

Only the greater address of a pair connects.  A node whose log lacks the entry that added a member with a
greater address must still take that member's link: else it never gives its word for the member's start
(the member, restarted, never counts) and never takes its AppendEntries (simulation seed 420719: a cluster
with every node up and no leader, for good).
"""
from __future__ import annotations

import random
import socket

import pytest
from quorum.raft import REVERSE_LINK
from quorum.raft.upstream import TcpTransportCore
from quorum.raftlink import CONNECTED
from tests.support.inproc import SimCluster, SimNode


def _port(addresses: list[str], above: bool) -> int:
    """A free port whose 127.0.0.1 address sorts above (or below) every one of ``addresses``.  pysyncobj
    compares addresses as strings: the cluster's ports are ephemeral (32768 and up), so a port of 9000-9999
    sorts above them and one of 10000-29999 below."""
    ports = list(range(9000, 10000) if above else range(10000, 30000))
    random.shuffle(ports)
    for port in ports:
        address = f"127.0.0.1:{port}"
        if not all(address > a if above else address < a for a in addresses):
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port whose address sorts {'above' if above else 'below'} {addresses}")


def _newcomer(c: SimCluster, above: bool, cluster_id: str | None = None) -> SimNode:
    """A fourth node, not in the cluster's configuration, whose Raft address sorts above every member's (it
    connects to them) or below (it dials them once they have not connected for ``connection_timeout``)."""
    return c.newcomer(_port([n.cfg.raft_address for n in c.nodes.values()], above), cluster_id=cluster_id)


@pytest.mark.parametrize("above", [True, False], ids=["address-above", "address-below"])
def test_nodes_give_their_word_to_a_peer_outside_their_configuration_and_record_it_once_it_is_a_member(above):
    with SimCluster() as c:
        epoch = c.register(1)
        c.allocate(1, epoch)
        members = list(c.nodes.values())
        new = _newcomer(c, above)
        new.start()
        address = new.cfg.raft_address

        # Its links are taken and its hello checked: every member welcomed it, and it has their word ...
        c.wait(lambda: new.on_loop(lambda: new.raft.vouched and all(
            new.raft._welcomed.get(n.cfg.raft_address) for n in members)),
            what="the members' word for a node outside their configuration")
        for n in members:
            assert address not in n.raft.members()
            # ... and none recorded anything of it: it is not a member.
            assert address not in n.on_loop(n.raft.identity.known_peers)
            assert n.on_loop(n.raft.status)["outside_peers"] == [address]

        # Added by the leader: each member records what the link's hello presented; the links stay as they are.
        c.leader().raft.add_member(address, timeout=10.0)
        uuid = new.raft.identity.hello.node_uuid
        c.wait(lambda: all(n.on_loop(n.raft.identity.known_peers).get(address, {}).get("node") == uuid
                           for n in members), what="every member to record the new member's identity")
        assert not any(n.on_loop(n.raft.status)["outside_peers"] for n in members)
        block = c.allocate(1, epoch)
        c.wait(lambda: new.next_producer_id() == block[0] + block[1], what="the new member to apply the block")
        c.assert_no_block_reissued()


def test_a_peer_outside_the_configuration_is_refused_when_it_presents_another_cluster():
    with SimCluster() as c:
        c.register(1)
        low = c.nodes[1]
        new = _newcomer(c, True, cluster_id="c-another")
        new.start()
        c.wait(lambda: new.halted is not None, what="the node of another cluster to be refused")
        assert "belongs to cluster" in new.halted[1]
        assert new.cfg.raft_address not in low.on_loop(low.raft.identity.known_peers)


class _Conn:
    """What the transport touches of a connection whose handshake is done."""
    sendRandKey = b"k" * 32

    def __init__(self):
        self.closed = False

    def disconnect(self):
        self.closed = True


@pytest.mark.parametrize("version", ["this", "earlier"])
def test_a_reverse_link_to_a_node_that_lists_the_dialler_is_closed_and_its_own_link_stays(version):
    """This version closes it: the node connects to the dialler itself, one link per pair.  pysyncobj's own
    transport (what a node of an earlier version runs) reads the reverse link's name as an address it does not
    list and closes it too, instead of taking it as the dialler's own link."""
    with SimCluster() as c:
        c.register(1)
        high, low = (max(c.nodes.values(), key=lambda n: n.cfg.raft_address),
                     min(c.nodes.values(), key=lambda n: n.cfg.raft_address))
        transport = high.raft._transport
        receive = transport.incoming_message if version == "this" else \
            lambda conn, message: TcpTransportCore.incoming_message(transport, conn, message)  # pysyncobj's own

        def low_link():
            return transport.connections[transport.address_nodes[low.cfg.raft_address]]

        own = high.on_loop(low_link)
        conn = _Conn()
        high.on_loop(lambda: receive(conn, REVERSE_LINK + low.cfg.raft_address))
        assert conn.closed
        assert high.on_loop(low_link) is own


class _LiveConn(_Conn):
    """A connection whose handshake is done and that takes what is sent on it."""
    encryptor = None
    state = CONNECTED

    def __init__(self):
        super().__init__()
        self.sent = []

    def send(self, message):
        self.sent.append(message)

    def setOnMessageReceivedCallback(self, callback):
        self.on_message = callback


def test_links_from_outside_the_configuration_are_bounded_and_forgotten_when_they_close():
    with SimCluster() as c:
        c.register(1)
        node = c.nodes[1]
        transport = node.raft._transport
        limit = transport.MAX_OUTSIDE
        conns = [_LiveConn() for _ in range(limit + 1)]
        addresses = [f"127.0.0.2:{9000 + i}" for i in range(limit + 1)]

        def offer(i):
            node.on_loop(lambda: transport._onIncomingMessageReceived(conns[i], addresses[i]))

        for i in range(limit):
            offer(i)
        assert not any(conn.closed for conn in conns[:limit])
        assert all(conn.sent and conn.sent[0]["type"] == "pq_hello" for conn in conns[:limit])  # checked first
        offer(limit)
        assert conns[limit].closed  # one too many: closed, nothing sent on it
        assert not conns[limit].sent

        node.on_loop(lambda: transport._onDisconnected(conns[0]))  # one closes: forgotten, a place is free
        assert node.on_loop(lambda: sorted(n.address for n in transport._outside())) == sorted(addresses[1:limit])
        conns[limit] = _LiveConn()
        offer(limit)
        assert not conns[limit].closed
        assert node.on_loop(node.raft.status)["members"] == node.raft.members()  # the configuration is untouched
        assert len(node.raft.members()) == 3
