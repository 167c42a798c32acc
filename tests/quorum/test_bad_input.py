"""Bad input on the client port, against a real three-node quorum.

Hand-built bytes go over raw sockets to one node's client port; after every
bad input the same node must still serve a normal client (ApiVersions on a
fresh ``Connection`` to exactly that node, then a broker registration and a
block allocation through a ``QuorumClient`` that knows only that node).

One module-scoped cluster serves the whole file (one per xdist worker); the
test at the end that documents a known node-killing bug uses conftest's
function-scoped ``cluster`` instead.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import random
import socket
import struct
import time
import uuid

import msgpack
import pytest
from kio.schema.envelope.v0.request import EnvelopeRequest

from quorum.client import api as p
from quorum.client.quorum import Connection, QuorumClient, RetryPolicy
from quorum.localcluster import LocalCluster
from tests.conftest import ClusterHarness, run, wait_for
from records.wire import kafka
from records.wire.errors import Errors, InvalidRequestError, StaleBrokerEpochError

MAX_FRAME = 1024 * 1024  # NodeConfig.max_frame_bytes default; LocalCluster does not change it
IO_TIMEOUT = 5.0
_broker_ids = itertools.count(7000)


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def qcluster(tmp_path_factory):
    lc = LocalCluster(str(tmp_path_factory.mktemp("bad-input") / "cluster"))
    try:
        lc.up(3)
        harness = ClusterHarness(lc)
        harness.leader(timeout=20)
        yield harness
    finally:
        lc.down(timeout=5)


@pytest.fixture(autouse=True)
def _logs_on_failure(request):
    yield
    rep = getattr(request.node, "rep_call", None)
    if rep is None or not rep.failed or "qcluster" not in request.fixturenames:
        return
    lc = request.getfixturevalue("qcluster").lc
    for n in lc.nodes():
        print(f"----- node {n.node_id} log -----\n{lc.tail_log(n.node_id, 60)}")


# ------------------------------------------------------------------- helpers


def _hostport(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)


def raw_conn(address: str) -> socket.socket:
    s = socket.create_connection(_hostport(address), timeout=IO_TIMEOUT)
    s.settimeout(IO_TIMEOUT)
    return s


def header_v1(api_key: int, version: int, corr: int, client_id: bytes = b"bad-input") -> bytes:
    """Request header v1: key, version, correlation id, nullable string client id."""
    return struct.pack(">hhih", api_key, version, corr, len(client_id)) + client_id


def header_v2(api_key: int, version: int, corr: int, client_id: bytes = b"bad-input") -> bytes:
    """Request header v2 (flexible APIs): v1 plus an empty tagged-field section."""
    return header_v1(api_key, version, corr, client_id) + b"\x00"


def framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def alloc_body(broker_id: int, broker_epoch: int) -> bytes:
    """AllocateProducerIds v0 body: int32 broker id, int64 epoch, no tagged fields."""
    return struct.pack(">iq", broker_id, broker_epoch) + b"\x00"


def _recv_exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    out = b""
    while len(out) < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"timed out reading {n} bytes (got {len(out)})")
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(n - len(out))
        except socket.timeout:
            raise AssertionError(f"timed out reading {n} bytes (got {len(out)})") from None
        if not chunk:
            raise AssertionError(f"server closed the connection after {len(out)} of {n} bytes")
        out += chunk
    return out


def read_frame(sock: socket.socket, timeout: float = IO_TIMEOUT) -> bytes:
    """One response frame, without its size prefix."""
    deadline = time.monotonic() + timeout
    (size,) = struct.unpack(">i", _recv_exact(sock, 4, deadline))
    assert 0 < size <= MAX_FRAME, f"bad response size {size}"
    return _recv_exact(sock, size, deadline)


def read_until_closed(sock: socket.socket, timeout: float = IO_TIMEOUT) -> bytes:
    """Everything the server sends until it closes the connection (a reset counts as closed)."""
    deadline = time.monotonic() + timeout
    data = b""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"server did not close the connection within {timeout}s (got {data!r})")
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            continue
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def expect_closed(sock: socket.socket, timeout: float = IO_TIMEOUT) -> None:
    data = read_until_closed(sock, timeout)
    assert data == b"", f"expected the server to close without answering, got {data!r}"


def corr_of(frame: bytes) -> int:
    return struct.unpack_from(">i", frame)[0]


@contextlib.asynccontextmanager
async def node_client(address: str, **options):
    """A ``QuorumClient`` that knows only the node at ``address`` (15 s a call, 3 s an attempt), closed on the way out."""
    c = QuorumClient([address], RetryPolicy(timeout=15.0, attempt_timeout=3.0), **options)
    try:
        yield c
    finally:
        await c.close()


async def register_new_broker(address: str) -> tuple[int, int]:
    """A broker id not used before, registered through the node at ``address``: (broker id, epoch)."""
    async with node_client(address) as c:
        broker_id = next(_broker_ids)
        return broker_id, await c.register_broker(broker_id)


def counters(h: ClusterHarness, address: str) -> dict:
    async def go():
        c = h.client()
        try:
            return await c.describe(address)
        finally:
            await c.close()
    d = run(go())
    assert d["error_code"] == 0, d
    return d["server"]


def wait_counter(h: ClusterHarness, address: str, name: str, at_least: int) -> int:
    """Counters are bumped by the server after it reads a frame: poll with a deadline."""
    return wait_for(lambda: (v := counters(h, address)[name]) >= at_least and v, timeout=5,
                    what=f"{name} >= {at_least} on {address}")


def assert_serves(h: ClusterHarness, address: str) -> None:
    """The node at ``address`` answers ApiVersions itself, and registers a broker and
    allocates a block for a client that knows only that node."""
    async def go():
        conn = Connection(address, "bad-input-check")
        try:
            body = await conn.call(kafka.request_entity(p.API_VERSIONS, 3, client_software_name="t",
                                                    client_software_version="1"), IO_TIMEOUT)
        finally:
            conn.close()
        assert int(body.error_code) == 0, body
        keys = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in body.api_keys}
        assert keys.get(p.ALLOCATE_PRODUCER_IDS) == (0, 0), keys
        async with node_client(address, client_id="bad-input-check") as client:
            broker_id = next(_broker_ids)
            epoch = await client.register_broker(broker_id)
            block = await client.allocate(broker_id, epoch)
        return epoch, block

    epoch, block = run(go())
    assert epoch >= 1
    assert block.length > 0 and block.start >= 0, block
    floor = getattr(h, "_next_id_floor", 0)
    assert block.start >= floor, f"block {block} starts below an earlier block's end {floor}"
    h._next_id_floor = block.next_id


def node_pid(h: ClusterHarness, address: str) -> int:
    n = next(n for n in h.lc.nodes() if n.client_address == address)
    assert h.lc.alive(n.node_id), f"node {n.node_id} is not running"
    return n.pid


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def apiversions_v3_frame(corr: int, total: int) -> bytes:
    """A valid ApiVersions v3 request whose payload (without size prefix) is exactly ``total`` bytes."""
    pad = max(0, total - 40)
    while True:
        data = kafka.encode_request(kafka.request_entity(p.API_VERSIONS, 3, client_software_name="a" * pad,
                                                 client_software_version="1"), corr, "bad-input")
        diff = total - (len(data) - 4)
        if diff == 0:
            return data
        pad += diff
        assert pad >= 0, f"cannot build an ApiVersions frame of {total} bytes"


def follower_address(h: ClusterHarness) -> str:
    leader = h.leader()
    return next(n.client_address for n in h.lc.nodes() if n.node_id != leader)


# ------------------------------------------------------ 1. frame size prefix


@pytest.mark.parametrize("size", [0, -1, -(2**31), 2 * 1024 * 1024, MAX_FRAME + 1, 2**31 - 1],
                         ids=["zero", "minus-one", "int32-min", "2MiB", "max-plus-one", "int32-max"])
def test_bad_frame_size_closes_connection(qcluster, size):
    address = qcluster.lc.client_addresses()[0]
    before = counters(qcluster, address)["bad_frames"]
    with raw_conn(address) as s:
        s.sendall(struct.pack(">i", size))
        expect_closed(s)
    assert wait_counter(qcluster, address, "bad_frames", before + 1) == before + 1
    assert_serves(qcluster, address)


def test_frame_of_exactly_max_size_is_served(qcluster):
    """The cap is inclusive: a valid request of exactly max_frame_bytes is answered."""
    address = qcluster.lc.client_addresses()[1]
    data = apiversions_v3_frame(4242, MAX_FRAME)
    assert struct.unpack(">i", data[:4])[0] == MAX_FRAME
    with raw_conn(address) as s:
        s.sendall(data)
        frame = read_frame(s)
    corr, body = p.QUORUM_API.parse_response(frame, p.API_VERSIONS, 3)
    assert corr == 4242 and int(body.error_code) == 0
    assert_serves(qcluster, address)


# --------------------------------------------------------- 2. truncated frame


def test_truncated_frame_then_close(qcluster):
    address = qcluster.lc.client_addresses()[0]
    with raw_conn(address) as s:
        s.sendall(struct.pack(">i", 100) + os.urandom(10))
    assert_serves(qcluster, address)
    # Half-close instead: the server sees end of input mid-frame and closes its side.
    with raw_conn(address) as s:
        s.sendall(struct.pack(">i", 100) + os.urandom(10))
        s.shutdown(socket.SHUT_WR)
        expect_closed(s)
    assert_serves(qcluster, address)


def test_truncated_frame_log_reports_bytes_received(qcluster):
    """The log line names how much of the frame arrived (it once always said 0)."""
    address = qcluster.lc.client_addresses()[2]
    node_id = next(n.node_id for n in qcluster.lc.nodes() if n.client_address == address)
    with raw_conn(address) as s:
        s.sendall(struct.pack(">i", 4321) + os.urandom(17))  # a size no other test uses
        s.shutdown(socket.SHUT_WR)
        expect_closed(s)

    def logged():
        with open(qcluster.lc.log_path(node_id), errors="replace") as f:
            return "truncated frame (17 of 4321 bytes); closing" in f.read()
    wait_for(logged, timeout=5, what=f"the truncated-frame line in node {node_id}'s log")
    assert_serves(qcluster, address)


def test_truncated_frame_held_open_does_not_block_others(qcluster):
    address = qcluster.lc.client_addresses()[1]
    data = apiversions_v3_frame(777, 100)
    assert len(data) == 104
    with raw_conn(address) as s:
        s.sendall(data[:4 + 10])  # size says 100, 10 bytes sent
        # Meanwhile other clients of the same node (and of the others) are served.
        assert_serves(qcluster, address)
        for other in qcluster.lc.client_addresses():
            assert_serves(qcluster, other)
        # The held frame was still being waited for, not dropped: complete it and get the answer.
        s.sendall(data[4 + 10:])
        frame = read_frame(s)
        corr, body = p.QUORUM_API.parse_response(frame, p.API_VERSIONS, 3)
        assert corr == 777 and int(body.error_code) == 0
    assert_serves(qcluster, address)


# -------------------------------------------------------- 3. truncated header


@pytest.mark.parametrize("n", [1, 3, 7])
def test_truncated_header_closes_connection(qcluster, n):
    address = qcluster.lc.client_addresses()[2]
    payload = header_v2(p.ALLOCATE_PRODUCER_IDS, 0, 99)[:n]
    assert len(payload) == n
    before = counters(qcluster, address)["bad_frames"]
    with raw_conn(address) as s:
        s.sendall(framed(payload))
        expect_closed(s)
    assert wait_counter(qcluster, address, "bad_frames", before + 1) == before + 1
    assert_serves(qcluster, address)


# ---------------------------------------------------------- 4. unknown API key


@pytest.mark.parametrize("api_key", [9999, 0, -1, 10003, 32767],
                         ids=["9999", "produce", "minus-one", "past-pidquorum-apis", "int16-max"])
def test_unknown_api_key_closes_connection(qcluster, api_key):
    address = qcluster.lc.client_addresses()[0]
    before = counters(qcluster, address)["bad_frames"]
    with raw_conn(address) as s:
        s.sendall(framed(header_v2(api_key, 0, 31337) + alloc_body(1, 1)))
        expect_closed(s)
    assert wait_counter(qcluster, address, "bad_frames", before + 1) == before + 1
    assert_serves(qcluster, address)


def test_unknown_api_key_after_valid_requests_flushes_their_answers(qcluster):
    """Requests read before the bad frame are still answered, in order, then the connection closes."""
    address = qcluster.lc.client_addresses()[1]
    good1 = kafka.encode_request(kafka.request_entity(p.API_VERSIONS, 0), 11)
    good2 = p.encode_admin_request({}, 12)
    with raw_conn(address) as s:
        s.sendall(good1 + good2 + framed(header_v2(9999, 0, 13)))
        data = read_until_closed(s)
    frames = []
    while data:
        assert len(data) >= 4
        size = struct.unpack_from(">i", data)[0]
        frames.append(data[4:4 + size])
        data = data[4 + size:]
    assert [corr_of(f) for f in frames] == [11, 12]
    assert int(p.QUORUM_API.parse_response(frames[0], p.API_VERSIONS, 0)[1].error_code) == 0
    assert p.QUORUM_API.parse_response(frames[1], p.ADMIN_API_KEY, 0)[1]["error_code"] == 0
    assert_serves(qcluster, address)


# ----------------------------------------------------- 5. unsupported version


def test_unsupported_allocate_version_closes_the_connection(qcluster):
    """As Kafka does: a version outside the advertised range is not answered (an answer in another
    version's layout would be misread); counted, and the node serves on."""
    address = qcluster.lc.client_addresses()[2]
    before = counters(qcluster, address)["unsupported_versions"]
    with raw_conn(address) as s:
        s.sendall(framed(header_v2(p.ALLOCATE_PRODUCER_IDS, 7, 0x0A0B0C0D) + alloc_body(1, 1)))
        assert read_until_closed(s) == b""
    assert wait_counter(qcluster, address, "unsupported_versions", before + 1) == before + 1
    assert_serves(qcluster, address)


def _parse_api_versions_v0(frame: bytes) -> tuple[int, int, dict[int, tuple[int, int]]]:
    corr, code, n = struct.unpack_from(">ihi", frame)
    off = 10
    assert 0 <= n <= 1000, n
    keys = {}
    for _ in range(n):
        k, lo, hi = struct.unpack_from(">hhh", frame, off)
        keys[k] = (lo, hi)
        off += 6
    assert off == len(frame), f"{len(frame) - off} bytes after the ApiVersions v0 response"
    return corr, code, keys


@pytest.mark.parametrize("version", [9, 4, 32767, -1])
def test_unsupported_api_versions_version_answers_35_in_v0(qcluster, version):
    address = qcluster.lc.client_addresses()[0]
    with raw_conn(address) as s:
        # Body as a v3+ client would send it; the server must not need to read it.
        s.sendall(framed(header_v2(p.API_VERSIONS, version, 0x13572468) + b"\x02t\x021\x00"))
        frame = read_frame(s)
    corr, code, keys = _parse_api_versions_v0(frame)
    assert corr == 0x13572468
    assert code == Errors.UNSUPPORTED_VERSION == 35
    assert keys.get(p.ALLOCATE_PRODUCER_IDS) == (0, 0), keys
    assert keys.get(p.API_VERSIONS) == (0, 3), keys
    assert keys == {k: v for k, v in p.SUPPORTED.items()}
    assert_serves(qcluster, address)


# ---------------------------------------------------------- 6. malformed body


def test_malformed_allocate_body_answers_42(qcluster):
    address = qcluster.lc.client_addresses()[1]
    rng = random.Random(0xBAD)
    garbage = rng.randbytes(3)
    before = counters(qcluster, address)["bad_requests"]
    with raw_conn(address) as s:
        s.sendall(framed(header_v2(p.ALLOCATE_PRODUCER_IDS, 0, 0x22446688) + garbage))
        corr, body = p.QUORUM_API.parse_response(read_frame(s), p.ALLOCATE_PRODUCER_IDS, 0)
        assert corr == 0x22446688, f"garbage {garbage!r}"
        assert int(body.error_code) == Errors.INVALID_REQUEST == 42, f"garbage {garbage!r}"
        assert int(body.producer_id_start) == -1 and int(body.producer_id_len) == 0
        # Empty body, and a body cut inside the epoch.
        for corr_id, bad in ((0x22446689, b""), (0x2244668A, alloc_body(1, 1)[:7])):
            s.sendall(framed(header_v2(p.ALLOCATE_PRODUCER_IDS, 0, corr_id) + bad))
            corr, body = p.QUORUM_API.parse_response(read_frame(s), p.ALLOCATE_PRODUCER_IDS, 0)
            assert (corr, int(body.error_code)) == (corr_id, 42), bad
    assert wait_counter(qcluster, address, "bad_requests", before + 3) == before + 3
    assert_serves(qcluster, address)


@pytest.mark.parametrize("trailer", [b"\x00", b"xyz", bytes(64)], ids=["1", "3", "64"])
def test_trailing_bytes_after_valid_body_answers_42(qcluster, trailer):
    address = qcluster.lc.client_addresses()[2]
    apiv = (kafka.encode_request(kafka.request_entity(p.API_VERSIONS, 0), 0x101)[4:], p.API_VERSIONS, 0)
    alloc = (header_v2(p.ALLOCATE_PRODUCER_IDS, 0, 0x102) + alloc_body(1, 1), p.ALLOCATE_PRODUCER_IDS, 0)
    with raw_conn(address) as s:
        for payload, key, version in (apiv, alloc):
            corr = corr_of(payload[4:])
            s.sendall(framed(payload + trailer))
            got_corr, body = p.QUORUM_API.parse_response(read_frame(s), key, version)
            assert got_corr == corr
            assert int(body.error_code) == Errors.INVALID_REQUEST, (key, trailer)
    assert_serves(qcluster, address)


# ------------------------------------------- 7. wrong field types, absurd values


def test_allocate_with_absurd_ids_and_epochs(qcluster):
    address = qcluster.lc.client_addresses()[0]

    async def go():
        async with node_client(address) as c:
            with pytest.raises(InvalidRequestError) as e:
                await c.allocate(-5, 1)
            assert e.value.code == Errors.INVALID_REQUEST == 42
            with pytest.raises(InvalidRequestError):
                await c.allocate(-(2**31), 1)
            with pytest.raises(StaleBrokerEpochError) as e:
                await c.allocate(2**31 - 1, 1)  # valid id, never registered
            assert e.value.code == Errors.STALE_BROKER_EPOCH == 77
            broker_id = next(_broker_ids)
            epoch = await c.register_broker(broker_id)
            for bad_epoch in (-1, 0, epoch + 1, 2**63 - 1, -(2**63)):
                with pytest.raises(StaleBrokerEpochError) as e:
                    await c.allocate(broker_id, bad_epoch)
                assert e.value.code == 77, bad_epoch
            block = await c.allocate(broker_id, epoch)  # the right epoch still works
            assert block.length > 0

    run(go())
    assert_serves(qcluster, address)


def test_registration_and_heartbeat_bad_values(qcluster):
    address = qcluster.lc.client_addresses()[1]

    async def go():
        async with node_client(address) as c:
            for bad_id in (-1, -(2**31)):
                with pytest.raises(InvalidRequestError) as e:
                    await c.register_broker(bad_id)
                assert e.value.code == 42
            # A null (all-zero) incarnation id is refused.
            conn = Connection(address)
            try:
                body = await conn.call(kafka.request_entity(p.BROKER_REGISTRATION, 0, broker_id=p.i32(next(_broker_ids)),
                                                        cluster_id="x", incarnation_id=None, listeners=(),
                                                        features=(), rack=None), IO_TIMEOUT)
            finally:
                conn.close()
            assert int(body.error_code) == 42
            # Stale epoch: the broker re-registered with a new incarnation.
            broker_id = next(_broker_ids)
            old = await c.register_broker(broker_id, uuid.uuid4())
            new = await c.register_broker(broker_id, uuid.uuid4())
            assert new > old
            with pytest.raises(StaleBrokerEpochError) as e:
                await c.heartbeat(broker_id, old)
            assert e.value.code == 77
            with pytest.raises(StaleBrokerEpochError):
                await c.heartbeat(next(_broker_ids), 1)  # never registered
            with pytest.raises(InvalidRequestError):
                await c.heartbeat(-1, new)
            with pytest.raises(StaleBrokerEpochError):
                await c.allocate(broker_id, old)
            assert (await c.heartbeat(broker_id, new))["should_shut_down"] is False

    run(go())
    assert_serves(qcluster, address)


def test_registration_with_invalid_utf8_cluster_id_answers_42(qcluster):
    address = qcluster.lc.client_addresses()[2]
    # BrokerRegistration v0 body: broker id, compact string cluster id (len+1 varint), uuid,
    # empty compact arrays (listeners, features), null compact string rack, no tagged fields.
    body = struct.pack(">i", next(_broker_ids)) + b"\x03\xff\xfe" + uuid.uuid4().bytes + b"\x01\x01\x00\x00"
    with raw_conn(address) as s:
        s.sendall(framed(header_v2(p.BROKER_REGISTRATION, 0, 0x5150) + body))
        corr, resp = p.QUORUM_API.parse_response(read_frame(s), p.BROKER_REGISTRATION, 0)
    assert corr == 0x5150
    assert int(resp.error_code) == 42 and int(resp.broker_epoch) == -1
    assert_serves(qcluster, address)


# ------------------------------------ 8. garbage connections, and pipelining


def test_many_garbage_connections(qcluster):
    address = qcluster.lc.client_addresses()[0]
    assert_serves(qcluster, address)  # forwarding connections exist before the baseline
    pid = node_pid(qcluster, address)
    baseline = open_fds(pid)
    before = counters(qcluster, address)["bad_frames"]
    rng = random.Random(20240607)
    for i in range(50):
        junk = rng.randbytes(rng.randrange(1, 300))
        if i % 2:  # a plausible size, so the junk reaches the header parser
            junk = struct.pack(">i", len(junk)) + junk
        with raw_conn(address) as s:
            try:
                s.sendall(junk)
                s.shutdown(socket.SHUT_WR)
            except (BrokenPipeError, ConnectionResetError):
                continue  # already closed by the server
            read_until_closed(s)  # whatever it says, it must close: we sent nothing more
    assert wait_counter(qcluster, address, "bad_frames", before + 25) >= before + 25
    assert_serves(qcluster, address)
    # Every one of those connections was released by the node.
    wait_for(lambda: open_fds(pid) <= baseline + 5, timeout=10, what=f"fds of node pid {pid} back near {baseline}")

    # Many half-sent frames held open at once: the node keeps serving, and frees them all on close.
    held = []
    try:
        before_held = open_fds(pid)
        for _ in range(50):
            s = raw_conn(address)
            held.append(s)
            s.sendall(struct.pack(">i", 1000) + rng.randbytes(10))
        # (slack: a few connections of earlier checks may still be closing when counted)
        wait_for(lambda: open_fds(pid) >= before_held + 40, timeout=10,
                 what=f"the held connections to be accepted (fds before: {before_held})")
        assert_serves(qcluster, address)
    finally:
        for s in held:
            s.close()
    wait_for(lambda: open_fds(pid) <= baseline + 5, timeout=10, what=f"fds of node pid {pid} back near {baseline}")
    assert_serves(qcluster, address)


def test_pipelined_requests_answered_in_order(qcluster):
    # On a follower, allocations are forwarded (slow) while ApiVersions is local (fast):
    # a server that wrote answers as they complete would reorder them.
    address = follower_address(qcluster)

    broker_id, epoch = run(register_new_broker(address))
    alloc = kafka.request_entity(p.ALLOCATE_PRODUCER_IDS, 0, broker_id=p.i32(broker_id), broker_epoch=p.i64(epoch))
    apiv = kafka.request_entity(p.API_VERSIONS, 3, client_software_name="t", client_software_version="1")
    plan = [  # (frame, api key, version, expected error code)
        (kafka.encode_request(alloc, 1001), p.ALLOCATE_PRODUCER_IDS, 0, 0),
        (kafka.encode_request(apiv, 1002), p.API_VERSIONS, 3, 0),
        (kafka.encode_request(alloc, 1003), p.ALLOCATE_PRODUCER_IDS, 0, 0),
        (framed(header_v2(p.API_VERSIONS, 9, 1004) + b"\x02t\x021\x00"), p.API_VERSIONS, 0, 35),
        (p.encode_admin_request({}, 1005), p.ADMIN_API_KEY, 0, 0),
        (framed(header_v2(p.ALLOCATE_PRODUCER_IDS, 0, 1006) + b"\x01"), p.ALLOCATE_PRODUCER_IDS, 0, 42),
        (kafka.encode_request(alloc, 1007), p.ALLOCATE_PRODUCER_IDS, 0, 0),
        (kafka.encode_request(kafka.request_entity(p.API_VERSIONS, 0), 1008), p.API_VERSIONS, 0, 0),
    ]
    # Last, a version the node does not serve: every request before it is answered, then the connection closes.
    unsupported = framed(header_v2(p.ALLOCATE_PRODUCER_IDS, 7, 1009) + alloc_body(broker_id, epoch))
    with raw_conn(address) as s:
        s.sendall(b"".join(f for f, *_ in plan) + unsupported)  # all written before any is read
        frames = [read_frame(s, timeout=15) for _ in plan]
        assert read_until_closed(s, timeout=15) == b""
    assert [corr_of(f) for f in frames] == list(range(1001, 1001 + len(plan)))
    blocks = []
    for frame, (_, key, version, code) in zip(frames, plan):
        corr, body = p.QUORUM_API.parse_response(frame, key, version)
        got = body["error_code"] if isinstance(body, dict) else int(body.error_code)
        assert got == code, (corr, body)
        if key == p.ALLOCATE_PRODUCER_IDS and code == 0:
            blocks.append((int(body.producer_id_start), int(body.producer_id_len)))
    assert len(blocks) == 3
    ranges = sorted(blocks)
    for (s1, l1), (s2, _) in zip(ranges, ranges[1:]):
        assert s1 + l1 <= s2, f"overlapping blocks {ranges}"
    assert_serves(qcluster, address)


# ---------------------------------------------- 9. DescribeState bad bodies


@pytest.mark.parametrize("body", [
    msgpack.packb([1, 2]), msgpack.packb(7), msgpack.packb("state"), msgpack.packb(None),
    msgpack.packb(True), msgpack.packb(b"\x00\x01", use_bin_type=True), b"", b"\x82\xa1",
    msgpack.packb({}) + b"\x01", b"\xc1", msgpack.packb({1: 2}),
], ids=["list", "int", "str", "nil", "bool", "bin", "empty", "truncated", "extra", "reserved-c1", "int-key"])
def test_describe_state_non_map_body_answers_42(qcluster, body):
    address = qcluster.lc.client_addresses()[1]
    before = counters(qcluster, address)["bad_requests"]
    with raw_conn(address) as s:
        s.sendall(framed(header_v1(p.ADMIN_API_KEY, 0, 0x7E57) + body))
        corr, resp = p.QUORUM_API.parse_response(read_frame(s), p.ADMIN_API_KEY, 0)
        assert corr == 0x7E57
        assert resp["error_code"] == Errors.INVALID_REQUEST and set(resp) == {"error_code", "error_message"}
        assert resp["error_message"].startswith("malformed DescribeState body"), resp
        # Same connection, a well-formed DescribeState is answered in full.
        s.sendall(framed(header_v1(p.ADMIN_API_KEY, 0, 0x7E58) + msgpack.packb({})))
        corr, resp = p.QUORUM_API.parse_response(read_frame(s), p.ADMIN_API_KEY, 0)
        assert corr == 0x7E58 and resp["error_code"] == 0 and "raft" in resp
    assert wait_counter(qcluster, address, "bad_requests", before + 1) == before + 1
    assert_serves(qcluster, address)


@pytest.mark.parametrize("tail", [b"", b"\x00", b"\x00\x64abc", b"\xff\xfe", b"\x00\x02\xff\xfe"],
                         ids=["no-client-id", "cut-length", "cut-client-id", "negative-length", "invalid-utf8"])
def test_describe_state_unreadable_header_answers_42(qcluster, tail):
    """As for the Kafka APIs, an unreadable header after a readable key, version and
    correlation id is answered INVALID_REQUEST, and the connection stays open."""
    address = qcluster.lc.client_addresses()[0]
    before = counters(qcluster, address)["bad_requests"]
    with raw_conn(address) as s:
        s.sendall(framed(struct.pack(">hhi", p.ADMIN_API_KEY, 0, 0x7E5A) + tail))
        corr, resp = p.QUORUM_API.parse_response(read_frame(s), p.ADMIN_API_KEY, 0)
        assert corr == 0x7E5A
        assert resp["error_code"] == Errors.INVALID_REQUEST and "header" in resp["error_message"], resp
        s.sendall(framed(header_v1(p.ADMIN_API_KEY, 0, 0x7E5B) + msgpack.packb({})))
        corr, resp = p.QUORUM_API.parse_response(read_frame(s), p.ADMIN_API_KEY, 0)
        assert corr == 0x7E5B and resp["error_code"] == 0 and "raft" in resp
    assert wait_counter(qcluster, address, "bad_requests", before + 1) == before + 1
    assert_serves(qcluster, address)


def test_describe_state_unsupported_version_answers_35(qcluster):
    address = qcluster.lc.client_addresses()[2]
    with raw_conn(address) as s:
        s.sendall(framed(header_v1(p.ADMIN_API_KEY, 1, 0x7E59) + msgpack.packb({})))
        corr, resp = p.QUORUM_API.parse_response(read_frame(s), p.ADMIN_API_KEY, 0)
    assert corr == 0x7E59 and resp["error_code"] == Errors.UNSUPPORTED_VERSION
    assert "not supported" in resp["error_message"], resp
    assert_serves(qcluster, address)


# ------------------------------------------------------ unknown tagged fields


@pytest.mark.parametrize("where", ["body", "header"])
def test_unknown_tagged_field_is_answered(qcluster, where):
    """Kafka skips unknown tagged fields; at worst the request is INVALID_REQUEST.  (Regression:
    kio raises KeyError for them, which parse_request once let escape, killing the connection
    handler and closing the connection unanswered.)"""
    address = qcluster.lc.client_addresses()[1]
    broker_id = next(_broker_ids)  # never registered: a tolerant server answers 77, a strict one 42
    tag = b"\x01\x05\x02ab"  # one tagged field: tag 5, 2 bytes
    if where == "body":
        payload = header_v2(p.ALLOCATE_PRODUCER_IDS, 0, 0x7A7) + struct.pack(">iq", broker_id, 1) + tag
    else:
        payload = header_v1(p.ALLOCATE_PRODUCER_IDS, 0, 0x7A7) + tag + alloc_body(broker_id, 1)
    with raw_conn(address) as s:
        s.sendall(framed(payload))
        s.shutdown(socket.SHUT_WR)
        data = read_until_closed(s, timeout=15)
    assert data, "the server closed the connection without answering"
    size = struct.unpack_from(">i", data)[0]
    assert len(data) == 4 + size, f"expected exactly one response, got {data!r}"
    corr, body = p.QUORUM_API.parse_response(data[4:], p.ALLOCATE_PRODUCER_IDS, 0)
    assert corr == 0x7A7
    assert int(body.error_code) in (Errors.INVALID_REQUEST, Errors.STALE_BROKER_EPOCH)
    assert_serves(qcluster, address)


# ------------------------------------------- lengths that would crash kio
#
# kio's native reader sizes an array from its wire length before reading any
# element; a 40-byte frame claiming 2**32 - 2 listeners made it allocate
# 32 GiB and abort the node.  records/wire/bounds.py bounds every length first.


@pytest.mark.parametrize("version", [0, 4])
def test_huge_array_length_does_not_kill_node(cluster, version):
    """A 40-byte BrokerRegistration whose listeners compact-array length is the varint
    ff ff ff ff 0f (2^32 - 2 entries): INVALID_REQUEST, and the node keeps serving.
    Own cluster: before the fix this killed the node."""
    address = cluster.lc.client_addresses()[0]
    cluster.leader(timeout=20)
    body = struct.pack(">i", 1) + b"\x01" + uuid.uuid4().bytes + bytes.fromhex("ffffffff0f")
    with raw_conn(address) as s:
        s.sendall(framed(header_v2(p.BROKER_REGISTRATION, version, 0x0BAD) + body))
        s.shutdown(socket.SHUT_WR)
        data = read_until_closed(s, timeout=15)
    assert data, "no answer: the node closed the connection or died"
    size = struct.unpack_from(">i", data)[0]
    corr, resp = p.QUORUM_API.parse_response(data[4:4 + size], p.BROKER_REGISTRATION, version)
    assert corr == 0x0BAD and int(resp.error_code) == Errors.INVALID_REQUEST
    assert_serves(cluster, address)


# ------------------------------------------------- forwarding (Envelope, KIP-590)
#
# A follower forwards a client's frame as it arrived to the leader inside an Envelope and relays
# the leader's answer frame as it is.  Envelope is parsed by every node but not advertised; without
# SASL any client can send one, so everything inside it is bad input like any other.


def _envelope(inner: bytes, principal: bytes | None = b"User:ANONYMOUS", host: bytes = b"\x7f\x00\x00\x01"):
    return EnvelopeRequest(request_data=inner, request_principal=principal, client_host_address=host)


def _send_envelope(address: str, envelope: EnvelopeRequest, corr: int = 0x0E0E) -> tuple[int, Errors, bytes | None]:
    with raw_conn(address) as s:
        s.sendall(kafka.encode_request(envelope, corr, "envelope-test"))
        got, resp = kafka.parse_response(read_frame(s), p.ENVELOPE, 0)
    return got, Errors.of(int(resp.error_code)), None if resp.response_data is None else bytes(resp.response_data)


def _leader_address(h: ClusterHarness) -> str:
    leader = h.leader()
    return next(n.client_address for n in h.lc.nodes() if n.node_id == leader)


def test_a_follower_forwards_the_clients_frame_and_relays_the_leaders_answer(qcluster):
    """AllocateProducerIds sent to a follower: the answer carries the client's own correlation id
    and a block, the follower counted one forward, and the leader answered it in an Envelope."""
    address = follower_address(qcluster)
    leader = _leader_address(qcluster)

    broker_id, epoch = run(register_new_broker(leader))
    before = counters(qcluster, address)["forwarded"]
    with raw_conn(address) as s:
        s.sendall(framed(header_v2(p.ALLOCATE_PRODUCER_IDS, 0, 0x5EED, b"odd \xc3\xa9 client")
                         + alloc_body(broker_id, epoch)))
        corr, body = p.QUORUM_API.parse_response(read_frame(s, timeout=20), p.ALLOCATE_PRODUCER_IDS, 0)
    assert corr == 0x5EED and int(body.error_code) == 0 and int(body.producer_id_len) > 0, body
    assert counters(qcluster, address)["forwarded"] >= before + 1


def test_the_leader_answers_an_envelope_with_the_inner_answer_frame(qcluster):
    address = _leader_address(qcluster)
    inner = kafka.encode_request(kafka.request_entity(p.API_VERSIONS, 3, client_software_name="t",
                                                      client_software_version="1"), 0x1234, "inner")[4:]
    corr, code, data = _send_envelope(address, _envelope(inner))
    assert corr == 0x0E0E and code == Errors.NONE
    inner_corr, body = p.QUORUM_API.parse_response(data, p.API_VERSIONS, 3)
    assert inner_corr == 0x1234 and int(body.error_code) == 0
    assert {int(k.api_key) for k in body.api_keys} == set(p.SUPPORTED)  # Envelope is not advertised


@pytest.mark.parametrize("inner, code", [
    (b"", Errors.INVALID_REQUEST),
    (b"\x00\x43", Errors.INVALID_REQUEST),  # truncated header
    (struct.pack(">hhi", 0x7FFF, 0, 1) + b"\x00\x00", Errors.INVALID_REQUEST),  # unknown API key
    (None, Errors.INVALID_REQUEST),  # an Envelope inside an Envelope
], ids=["empty", "truncated", "unknown-key", "nested"])
def test_a_bad_envelope_is_refused_and_the_node_serves_on(qcluster, inner, code):
    address = _leader_address(qcluster)
    if inner is None:
        inner = kafka.encode_request(_envelope(b"\x00"), 7, "nested")[4:]
    corr, got, data = _send_envelope(address, _envelope(inner))
    assert corr == 0x0E0E and got == code and data is None
    assert_serves(qcluster, address)


def test_an_unsupported_version_in_an_envelope_is_unsupported_version(qcluster):
    """Inside a well-formed envelope, a request at a version the leader does not serve answers the
    Envelope UNSUPPORTED_VERSION (as Kafka's EnvelopeUtils does), told apart from a malformed Envelope."""
    address = _leader_address(qcluster)
    inner = header_v2(p.ALLOCATE_PRODUCER_IDS, 9, 0x4321) + alloc_body(1, 1)
    corr, code, data = _send_envelope(address, _envelope(inner, principal=None, host=b"junk"))
    assert corr == 0x0E0E and code == Errors.UNSUPPORTED_VERSION and data is None
    assert_serves(qcluster, address)


def test_a_bad_body_in_an_envelope_gets_its_own_error_answer(qcluster):
    """Inside the envelope, a request with a readable header and a bad body is answered as a client
    would be answered (INVALID_REQUEST), in the raw answer the follower would relay."""
    address = _leader_address(qcluster)
    inner = header_v2(p.ALLOCATE_PRODUCER_IDS, 0, 0x4321) + b"\x01"
    corr, code, data = _send_envelope(address, _envelope(inner, principal=None, host=b"junk"))
    assert code == Errors.NONE
    inner_corr, body = p.QUORUM_API.parse_response(data, p.ALLOCATE_PRODUCER_IDS, 0)
    assert inner_corr == 0x4321 and int(body.error_code) == Errors.INVALID_REQUEST
    assert_serves(qcluster, address)


def test_a_follower_does_not_forward_a_forwarded_request_again(qcluster):
    """An Envelope reaching a node that is not the leader is answered NOT_CONTROLLER (the forwarding
    node then tries the new leader), never forwarded a second time."""
    address = follower_address(qcluster)
    before = counters(qcluster, address)["forwarded"]
    inner = header_v2(p.ALLOCATE_PRODUCER_IDS, 0, 0x4322) + alloc_body(1, 1)
    corr, code, data = _send_envelope(address, _envelope(inner))
    assert code == Errors.NOT_CONTROLLER and data is None
    assert counters(qcluster, address)["forwarded"] == before
