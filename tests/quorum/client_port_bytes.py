"""Raw bytes on a node's client port: frames and headers built by hand, reading answers and closes, and
the check that a node still serves.  Shared by test_bad_input* and the broker's frontend tests."""
from __future__ import annotations

import contextlib
import itertools
import os
import socket
import struct
import time

import pytest

from quorum.client import api as p
from quorum.client.quorum import Connection, QuorumClient, RetryPolicy
from tests.conftest import ClusterHarness, run, wait_for
from records.wire import kafka


MAX_FRAME = 1024 * 1024  # NodeConfig.max_frame_bytes default; LocalCluster does not change it
IO_TIMEOUT = 5.0
_broker_ids = itertools.count(7000)


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
