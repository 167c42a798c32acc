"""The Raft port's per-connection AES-GCM (quorum.linkcrypto): the codec alone, then real node processes,
all of this version or mixed with a node that seals with Fernet only (as earlier versions do)."""
from __future__ import annotations

import os
import pickle
import threading
import zlib

import pysyncobj.pickle
import pytest
from cryptography.fernet import Fernet, InvalidToken

from cli.render import _link
from quorum import linkcrypto, raftlink
from quorum.linkcrypto import AEAD1, FERNET, LinkCodec, direction_key, master_key
from records import encode_batch
from tests.conftest import ClusterHarness, cluster_harness, run, wait_for
from tests.support.inproc import SimCluster
from tests.quorum.test_cluster import assert_disjoint

FERNET_NODE = os.path.join(os.path.dirname(__file__), "..", "support", "fernet_node.py")


class Conn:
    """The two fields of pysyncobj's TcpConnection the codec reads."""

    def __init__(self, send_rand: bytes, recv_rand: bytes):
        self.sendRandKey, self.recvRandKey, self.recvLastTimestamp = send_rand, recv_rand, 0


def link_pair(secret: str = "s3cret", fernet: Fernet | None = None):
    """Both ends of one connection after pysyncobj's handshake: each side picked its bytes."""
    fernet = fernet or Fernet(Fernet.generate_key())
    master = master_key(secret)
    a_bytes, b_bytes = os.urandom(32), os.urandom(32)
    a_conn, b_conn = Conn(b_bytes, a_bytes), Conn(a_bytes, b_bytes)
    return LinkCodec(fernet, master, a_conn), LinkCodec(fernet, master, b_conn), fernet


def deliver(codec: LinkCodec, token: bytes) -> bytes:
    """What TcpConnection does with a received token: the timestamp first, then the plaintext."""
    codec.extract_timestamp(token)
    return codec.decrypt(token)


def switched_pair():
    a, b, fernet = link_pair()
    a.seal_from_now()
    b.open_from_now()
    return a, b, fernet


def test_a_link_stays_fernet_until_a_direction_switches():
    a, b, fernet = link_pair()
    token = a.encrypt_at_time(b"hello", 7)
    assert fernet.decrypt(token) == b"hello" and fernet.extract_timestamp(token) == 7
    assert deliver(b, token) == b"hello"
    assert a.describe() == b.describe() == {"out": FERNET, "in": FERNET}


def test_after_the_switch_messages_are_aes_gcm_in_order_and_the_other_direction_is_unchanged():
    a, b, fernet = switched_pair()
    tokens = [a.encrypt_at_time(f"m{i}".encode(), 1) for i in range(5)]
    with pytest.raises(InvalidToken):
        fernet.decrypt(tokens[0])  # not Fernet any more
    assert [deliver(b, t) for t in tokens] == [f"m{i}".encode() for i in range(5)]
    assert a.describe() == {"out": AEAD1, "in": FERNET} and b.describe() == {"out": FERNET, "in": AEAD1}
    back = b.encrypt_at_time(b"ack", 3)
    assert fernet.decrypt(back) == b"ack" and deliver(a, back) == b"ack"


@pytest.mark.parametrize("bad", ["replayed", "reordered", "dropped", "altered", "other-direction", "other-link",
                                 "other-secret"])
def test_a_message_that_is_not_the_next_one_of_this_direction_of_this_link_does_not_open(bad):
    a, b, _ = switched_pair()
    first, second = a.encrypt_at_time(b"one", 1), a.encrypt_at_time(b"two", 1)
    if bad == "replayed":
        deliver(b, first)
        token = first
    elif bad in ("reordered", "dropped"):
        token = second  # the receiver expects "one" first
    elif bad == "altered":
        token = first[:-1] + bytes([first[-1] ^ 1])
    elif bad == "other-direction":
        b.seal_from_now()
        token = b.encrypt_at_time(b"one", 1)  # b's own first message, reflected back to it
    elif bad == "other-link":
        c, _, _ = link_pair(fernet=a._fernet)
        c.seal_from_now()
        token = c.encrypt_at_time(b"one", 1)
    else:
        c = LinkCodec(a._fernet, master_key("another"), a._conn)  # same handshake, another secret
        c.seal_from_now()
        token = c.encrypt_at_time(b"one", 1)
    with pytest.raises(InvalidToken):
        deliver(b, token)


def test_each_direction_has_its_own_key_and_each_link_its_own():
    master = master_key("s")
    x, y = os.urandom(32), os.urandom(32)
    assert direction_key(master, x, y) != direction_key(master, y, x)
    assert direction_key(master, x, y) != direction_key(master, x, os.urandom(32))
    assert direction_key(master, x, y) != direction_key(master_key("t"), x, y)
    assert direction_key(master, x, y) == direction_key(master_key("s"), x, y)
    with pytest.raises(ValueError):
        direction_key(master, None, y)


def test_a_new_handshake_on_a_reused_connection_object_is_fernet_again():
    # pysyncobj reconnects an outgoing link with the same TcpConnection object and new handshake bytes.
    a, b, fernet = switched_pair()
    a._conn.sendRandKey, a._conn.recvRandKey = None, os.urandom(32)  # disconnect(), then a new handshake
    token = a.encrypt_at_time(b"rand", 9)
    assert fernet.decrypt(token) == b"rand"
    assert a.describe() == {"out": FERNET, "in": FERNET}


def test_decrypt_without_the_timestamp_first_is_refused_once_aes_gcm():
    a, b, _ = switched_pair()
    with pytest.raises(InvalidToken):
        b.decrypt(a.encrypt_at_time(b"x", 1))


@pytest.mark.parametrize("size", [0, 1, 250, linkcrypto.COMPRESS_FROM - 1, linkcrypto.COMPRESS_FROM, 70_000])
def test_what_pysyncobj_deflates_is_an_ordinary_zlib_stream_and_small_messages_are_stored(size):
    assert raftlink.MessageZlib is linkcrypto.MessageZlib  # what a Raft connection sends with
    data = os.urandom(size // 2) + bytes(size - size // 2)  # half noise, half zeros: deflate would shrink it
    out = linkcrypto.MessageZlib.compress(data, 3)
    assert zlib.decompress(out) == data  # what a peer of any version does with it
    if size < linkcrypto.COMPRESS_FROM:
        assert len(out) == size + 11  # header, one stored block's 5 bytes, adler32: nothing deflated
    else:
        assert len(out) < size  # a large message is still deflated


def test_a_stored_message_whose_bytes_are_damaged_does_not_decompress():
    out = bytearray(linkcrypto.MessageZlib.compress(b"append_entries" * 10))
    out[20] ^= 1
    with pytest.raises(zlib.error):
        zlib.decompress(bytes(out))


def test_messages_are_pickled_with_protocol_4_and_each_side_reads_the_others_version():
    assert raftlink.MessagePickle is linkcrypto.MessagePickle  # what a Raft connection sends with
    m = {"type": "append_entries", "term": 3, "commit_index": 41, "prevLogIdx": 41, "prevLogTerm": 3,
         "entries": [(bytes(range(256)) * 2, 42, 3)]}
    out = linkcrypto.MessagePickle.dumps(m)
    assert out[:2] == b"\x80\x04" and b"_codecs" not in out  # protocol 4: bytes as bytes
    assert linkcrypto.MessagePickle.loads(out) == m
    assert pysyncobj.pickle.loads(out) == m  # what an earlier version does with it
    old = pysyncobj.pickle.dumps(m)  # an earlier version's message: protocol 2, bytes through _codecs.encode
    assert old[:2] == b"\x80\x02" and b"_codecs" in old and len(out) < len(old)
    assert linkcrypto.MessagePickle.loads(old) == m
    with pytest.raises(pickle.UnpicklingError):
        linkcrypto.MessagePickle.loads(out[:-3])  # a cut message fails (pysyncobj then closes the link)


def test_an_entrys_command_is_pickled_with_protocol_4_and_an_earlier_versions_is_applied_alike():
    """``RaftNode.propose`` makes the command pysyncobj's ``@replicated`` wrapper makes (the method's number
    and the payload), pickled with protocol 4; a command of the wrapper itself (protocol 2, as an earlier
    version's leader proposes) commits and is applied the same on every node."""
    with SimCluster() as c:
        c.register(1)
        leader = c.leader()
        obj = leader.raft._obj
        func_id = obj._methodToID[obj._getFuncName("apply_entry")]
        payload = encode_batch([])
        c._propose(leader, [], 2.0)
        command = leader.on_loop(lambda: bytes(leader.raft.journal.entries[-1][0]))
        assert command[0] == 0 and command[1:3] == b"\x80\x04"  # a regular command, protocol 4
        assert pickle.loads(command[1:]) == (func_id, (payload,))

        done, out = threading.Event(), []
        leader.raft._obj.apply_entry(payload, callback=lambda result, error: (out.append(error), done.set()))
        assert done.wait(5) and out == [0]  # pysyncobj's FAIL_REASON.SUCCESS
        index = leader.on_loop(lambda: leader.raft.journal.entries[-1][1])
        older = leader.on_loop(lambda: bytes(leader.raft.journal.entries[-1][0]))
        assert older[1:3] == b"\x80\x02" and pickle.loads(older[1:]) == (func_id, (payload,))
        c.wait(lambda: all(n.on_loop(lambda n=n: n.raft._obj.last_applied) >= index for n in c.running()),
               what="every node to apply the earlier version's command")
        c.allocate(1, c.register(1))


def test_pidctl_shows_a_links_encoding_in_one_name_when_both_directions_agree():
    assert _link({"out": AEAD1, "in": AEAD1}) == "AES-GCM"
    assert _link({"out": FERNET, "in": FERNET}) == "Fernet"
    assert _link({"out": AEAD1, "in": FERNET}) == "out AES-GCM, in Fernet"


# ------------------------------------------------------------------ real node processes
def links(cluster: ClusterHarness) -> dict[tuple[int, int], dict]:
    """(node, peer node) -> that node's view of the link's encoding, both directions."""
    by_raft = {n.raft_address: n.node_id for n in cluster.lc.nodes()}
    out = {}
    for node_id, d in cluster.describe_all().items():
        for address, peer in d["raft"]["peers"].items():
            out[(node_id, by_raft[address])] = peer["link"]
    return out


def allocate(cluster: ClusterHarness, broker: int, n: int):
    async def go():
        c = cluster.client(timeout=20.0)
        try:
            epoch = await c.register_broker(broker)
            return [await c.allocate(broker, epoch) for _ in range(n)]
        finally:
            await c.close()
    return run(go())


def test_every_link_switches_to_aes_gcm_and_does_again_after_a_restart(cluster):
    everywhere = {"out": AEAD1, "in": AEAD1}
    wait_for(lambda: len(got := links(cluster)) == 6 and all(v == everywhere for v in got.values()), 15,
             what="every link of the three nodes to switch")
    blocks = allocate(cluster, 1, 20)
    # The node with the lowest Raft address is connected to by both others: they reconnect to it with the
    # connection objects they already had (pysyncobj reuses them), after a new handshake.
    lowest = min(cluster.lc.nodes(), key=lambda n: n.raft_address).node_id
    cluster.lc.kill(lowest)
    cluster.lc.start(lowest)
    cluster.lc.wait_ready([lowest])
    wait_for(lambda: len(got := links(cluster)) == 6 and all(v == everywhere for v in got.values()), 15,
             what="the restarted node's links to switch again")
    blocks += allocate(cluster, 2, 20)
    assert_disjoint(blocks)


@pytest.fixture
def mixed(tmp_path, request):
    """Nodes 1 and 2 of this version; node 3 seals with Fernet only (an earlier version)."""
    yield from cluster_harness(tmp_path, request, commands={3: [FERNET_NODE]})


def test_a_cluster_mixing_versions_commits_with_fernet_to_the_older_node(mixed):
    want = {(1, 2): AEAD1, (2, 1): AEAD1, (1, 3): FERNET, (3, 1): FERNET, (2, 3): FERNET, (3, 2): FERNET}
    wait_for(lambda: {k: v["out"] for k, v in links(mixed).items() if v} == want, 15,
             what="the links between new nodes to switch, and those to the older node to stay Fernet")
    assert all(v["in"] == v["out"] for v in links(mixed).values())
    blocks = allocate(mixed, 1, 20)
    leader = mixed.leader()
    mixed.lc.kill(leader)  # whichever version leads, the two others commit together
    blocks += allocate(mixed, 2, 20)
    assert_disjoint(blocks)
    assert linkcrypto.OFFERED == (AEAD1,)  # the older node's setting stayed in its own process
