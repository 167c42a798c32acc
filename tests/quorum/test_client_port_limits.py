"""What an unauthenticated peer can cost a SASL_SSL quorum's client port (quorum.server, quorum.security.limits):
connection caps, the TLS handshake and authentication deadlines, the frame cap before authentication,
and the node's memory under connections parking partial frames; authenticated clients served throughout.

Each test runs against a one-node SASL_SSL quorum started with the limits it needs (``secure_node``);
the attacking connections are raw sockets, from several loopback addresses (127.0.0.x) where a test
needs more than one client address.
"""
from __future__ import annotations

import asyncio
import os
import select
import socket
import ssl
import time

import pytest

from benchmarks.pki import make_pki
from quorum.client.quorum import QuorumClient, RetryPolicy
from quorum.localcluster import LocalCluster
from quorum.security import credentials
from quorum.security.client import ClientSecurity
from quorum.security.limits import ByteBudget
from quorum.security.tls import client_context
from quorum.telemetry.metrics import read_metrics
from tests.conftest import wait_for
from tests.security.conftest import PASSWORDS
from tests.support.sockets import close_all, closed, refused_frames, trickle, unsent, wait_closed
from records.wire import kafka

KiB, MiB = 1024, 1024 * 1024
PREAUTH_FRAME = 64 * KiB  # max_unauthenticated_frame_bytes (the default) in every node below
MAX_FRAME = 1 * MiB  # max_frame_bytes (the default)
# What one TLS connection costs the node besides the bytes it parks: asyncio's SSL protocol allocates a
# 256 KiB read buffer per connection (sslproto.SSLProtocol.max_size), then the OpenSSL objects, the stream
# reader, the task.  Measured about 300 KiB; twice that here, so the bound is generous.
PER_CONNECTION_OVERHEAD = 600 * KiB


class Node:
    """One SASL_SSL quorum node started with some limits, and ways to reach it."""

    def __init__(self, lc: LocalCluster, pki):
        self.lc, self.pki = lc, pki
        self.address = lc.client_addresses()[0]
        host, port = self.address.rsplit(":", 1)
        self.host, self.port = host, int(port)
        self.pid = lc.nodes()[0].pid
        self.metrics_address = lc.nodes()[0].metrics_address

    def client(self, user: str = "admin", timeout: float = 10.0) -> QuorumClient:
        security = ClientSecurity("SASL_SSL", "PLAIN", user, PASSWORDS[user], self.pki.cafile)
        return QuorumClient([self.address], RetryPolicy(timeout=timeout, attempt_timeout=2.0),
                            client_id=f"test-{user}", security=security)

    def status(self) -> dict:
        """The node's DescribeState, asked by an authenticated client (which the limits must let through)."""
        async def go():
            c = self.client()
            try:
                return await c.describe(self.address)
            finally:
                await c.close()
        return asyncio.run(go())

    def server(self) -> dict:
        return self.status()["server"]

    def metric(self, name: str) -> float:
        """A figure of the node's /metrics (read over HTTP: no client-port connection of its own)."""
        return read_metrics(self.metrics_address)[name]

    def wait_connections(self, n: int) -> None:
        wait_for(lambda: self.metric("pidquorum_client_connections") == n, 10,
                 what=f"the node to count {n} client connections")

    def serves(self) -> bool:
        """An authenticated client registers a broker: the node still serves who is allowed."""
        async def go():
            c = self.client("admin")
            try:
                return await c.register_broker(1) > 0
            finally:
                await c.close()
        return asyncio.run(go())

    def rss(self) -> int:
        """The node process's resident set (/proc/<pid>/status VmRSS), in bytes."""
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def raw(self, source: str = "127.0.0.1") -> socket.socket:
        """A TCP connection to the client port from ``source`` (a loopback address), nothing sent."""
        return socket.create_connection((self.host, self.port), timeout=10, source_address=(source, 0))

    def tls(self, source: str = "127.0.0.1") -> ssl.SSLSocket:
        """A TLS connection (handshake done), not authenticated."""
        return client_context(self.pki.cafile).wrap_socket(self.raw(source), server_hostname="localhost")


@pytest.fixture(scope="module")
def secure_node(tmp_path_factory):
    """``secure_node(name, **limits)``: a one-node SASL_SSL quorum with those node settings, started once
    per module and name (users admin, broker, alice, bob: the security suite's ``PASSWORDS``)."""
    base = tmp_path_factory.mktemp("client-port-limits")
    pki = make_pki(str(base / "pki"))
    users = str(base / "users.json")
    for user, password in PASSWORDS.items():
        credentials.add_user(users, user, password)
    started: dict[str, Node] = {}

    def start(name: str, **limits) -> Node:
        if name not in started:
            lc = LocalCluster(str(base / name))
            lc.up(1, metrics=True, sasl_credentials_file=users, super_users=["User:admin"], tls_certfile=pki.certfile,
                  tls_keyfile=pki.keyfile, tls_cafile=pki.cafile, **limits)
            started[name] = Node(lc, pki)
        return started[name]

    yield start
    for node in started.values():
        if os.environ.get("PIDQUORUM_SHOW_LOGS"):
            print(node.lc.tail_log(1, 60))
        node.lc.down(timeout=5)


def stays_open(sock: socket.socket, seconds: float) -> bool:
    """Whether ``sock`` is still open after ``seconds`` (checked whenever something arrives)."""
    deadline = time.monotonic() + seconds
    while not closed(sock):
        left = deadline - time.monotonic()
        if left <= 0:
            return True
        select.select([sock], [], [], left)
    return False


def _client_hello() -> bytes:
    """The bytes of a real TLS ClientHello."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname="localhost")
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()


# ----------------------------------------------------------------------------------------- caps
CAPS = dict(max_connections=8, max_connections_per_ip=4, max_connection_buffer_bytes=1024,
            authentication_timeout_ms=60_000, tls_handshake_timeout_ms=60_000)


def test_connections_over_the_per_ip_and_total_caps_are_refused_at_once(secure_node):
    node = secure_node("caps", **CAPS)
    before = node.server()
    refused = node.metric("pidquorum_client_connections_refused_total")
    node.wait_connections(0)  # the status call's connection closed: the caps below count from 0
    held = []
    try:
        # per address: 4 from 127.0.0.2 are kept open (not even a TLS handshake: counted from the accept) ...
        held += [node.raw("127.0.0.2") for _ in range(4)]
        extra = node.raw("127.0.0.2")
        wait_closed(extra, 10, "the 5th connection from one address (max_connections_per_ip=4)")
        extra.close()
        assert not any(closed(s) for s in held)  # accepted before the refused one: still open
        # ... while another address is served: an authenticated client from 127.0.0.1
        assert node.serves()
        node.wait_connections(4)
        # in total: 4 more from two other addresses make 8 ...
        held += [node.raw("127.0.0.3") for _ in range(2)] + [node.raw("127.0.0.4") for _ in range(2)]
        extra = node.raw("127.0.0.5")
        wait_closed(extra, 10, "the 9th connection (max_connections=8)")
        extra.close()
        assert not any(closed(s) for s in held)
    finally:
        close_all(held)
    # the held ones gone, the node serves again, and counted what it refused
    node.wait_connections(0)
    assert node.metric("pidquorum_client_connections_refused_total") - refused == 2
    server = node.server()
    assert server["connections_refused"] - before["connections_refused"] == 2
    assert server["connections_refused_per_ip"] - before["connections_refused_per_ip"] == 1
    assert node.serves()
    assert "max_connections_per_ip" in node.lc.tail_log(1, 200)


def test_requests_past_the_connection_buffer_wait_unread_and_are_all_answered(secure_node):
    node = secure_node("caps", **CAPS)
    pauses = node.metric("pidquorum_client_read_pauses_total")

    async def go():
        c = node.client("admin")
        try:  # 100 registrations (a Raft commit each) pipelined on one connection: far over 1 KiB in flight
            return await asyncio.gather(*(c.register_broker(100 + i) for i in range(100)))
        finally:
            await c.close()
    epochs = asyncio.run(go())
    assert len(epochs) == 100 and all(e > 0 for e in epochs)
    assert node.metric("pidquorum_client_read_pauses_total") > pauses


# ------------------------------------------------------------------ frames before authentication
def open_unauthenticated_and_wait_closed(connect) -> list:
    """Three connections that never authenticate: idle (TLS done, if any, then nothing), one that only
    negotiated (ApiVersions, served before SASL), one sending a frame a byte every 100 ms (never idle, never
    whole).  Returns them once each was closed by the authentication deadline (the trickle well before its
    frame was whole).  ``connect()``: a new connection (the broker's tests use it too)."""
    idle, negotiating, trickling = socks = [connect(), connect(), connect()]
    negotiating.sendall(kafka.encode_request(kafka.request_entity(kafka.API_VERSIONS, 0), 1, "probe"))
    frame = kafka.SIZE.pack(1000) + b"\0" * 1000
    t0 = time.monotonic()
    sent = 0
    while not closed(trickling):
        assert time.monotonic() - t0 < 15, "the trickling connection was not closed at the deadline"
        try:
            trickling.sendall(frame[sent:sent + 1])  # a byte every 100 ms does not keep it open
        except OSError:
            break  # closed under the send
        sent += 1
        select.select([trickling], [], [], 0.1)
    assert sent < len(frame), sent
    for s, what in ((idle, "an idle connection"), (negotiating, "a connection that only negotiated")):
        wait_closed(s, 10, what)
    return socks


def check_unauthenticated_frame_cap(connect, bad_frames) -> None:
    """A frame announced 1 byte over PREAUTH_FRAME closes a connection that has not authenticated before its body
    is read (counted once in ``bad_frames()``); one of exactly the cap is read (then refused as the garbage it
    is, not for its size).  ``connect()``: a new connection to the listener (the broker's tests use it too)."""
    bad_before = bad_frames()
    s = connect()
    try:
        s.sendall(kafka.SIZE.pack(PREAUTH_FRAME + 1) + b"\0" * 100)  # 1 byte over; far under max_frame_bytes
        wait_closed(s, 10, "a connection announcing a frame over max_unauthenticated_frame_bytes")
    finally:
        s.close()
    assert bad_frames() - bad_before == 1
    s = connect()
    try:
        s.sendall(kafka.SIZE.pack(PREAUTH_FRAME) + b"\0" * (PREAUTH_FRAME - 1))
        assert stays_open(s, 0.5), "closed while a frame under the cap was incomplete"
    finally:
        s.close()


def test_a_frame_over_the_unauthenticated_cap_closes_the_connection_before_its_body_is_read(secure_node):
    node = secure_node("caps", **CAPS)
    check_unauthenticated_frame_cap(node.tls, lambda: node.metric("pidquorum_bad_frames_total"))
    assert node.serves()


# ------------------------------------------------------------------------------------ deadlines
DEADLINES = dict(max_connections=100, max_connections_per_ip=100, authentication_timeout_ms=3000,
                 tls_handshake_timeout_ms=2000)


def test_connections_that_never_authenticate_are_closed_at_the_deadline(secure_node):
    node = secure_node("deadlines", **DEADLINES)
    loop = asyncio.new_event_loop()
    authenticated = node.client("admin")
    loop.run_until_complete(authenticated.register_broker(2))  # its connection stays open past the deadline
    before = node.metric("pidquorum_client_authentication_timeouts_total")
    socks = []
    try:
        socks = open_unauthenticated_and_wait_closed(node.tls)
        # authenticated clients are served meanwhile and after, and are not held to the deadline: the one
        # connected before the attack is still served (the 3 closed connections are the attackers')
        c_ok = node.serves()
        assert loop.run_until_complete(authenticated.register_broker(2)) > 0
    finally:
        close_all(socks)
        loop.run_until_complete(authenticated.close())
        loop.close()
    assert c_ok
    assert node.metric("pidquorum_client_authentication_timeouts_total") - before == 3
    assert "authentication_timeout_ms" in node.lc.tail_log(1, 200)


def test_a_client_hello_trickled_a_byte_at_a_time_is_closed_at_the_handshake_deadline(secure_node):
    node = secure_node("deadlines", **DEADLINES)
    hello = _client_hello()
    before = node.metric("pidquorum_client_authentication_timeouts_total")
    slow = [node.raw(f"127.0.0.{2 + i % 4}") for i in range(20)]
    try:  # served while the handshakes hang
        sent, _ = trickle(slow, hello, 15, "a trickled ClientHello kept its connection open", meanwhile=node.serves)
        assert sent < len(hello)
    finally:
        close_all(slow)
    assert node.metric("pidquorum_client_authentication_timeouts_total") - before == len(slow)
    assert node.serves()


# ------------------------------------------------------------------------------------------ memory
def test_connections_parking_partial_frames_cost_at_most_the_unauthenticated_cap_each(secure_node):
    n = 100
    node = secure_node("memory", max_connections=2 * n + 10, max_connections_per_ip=2 * n + 10,
                       authentication_timeout_ms=120_000, tls_handshake_timeout_ms=60_000)
    for _ in range(3):  # warm up: TLS, SASL and the handlers have run once, the heap has its working size
        close_all([node.tls() for _ in range(10)])
        assert node.serves()
    base = node.rss()
    parked = []
    try:
        # n connections, each parking a frame just under the cap before authentication
        for i in range(n):
            s = node.tls(f"127.0.0.{2 + i % 8}")
            s.sendall(kafka.SIZE.pack(PREAUTH_FRAME) + b"\1" * (PREAUTH_FRAME - 1))
            parked.append(s)
        wait_for(lambda: all(unsent(s) == 0 for s in parked), 20, what="the node to take the parked bytes")
        assert node.serves()
        node.wait_connections(n)
        during = max(node.rss() for _ in range(5))
        bound = n * (PREAUTH_FRAME + PER_CONNECTION_OVERHEAD)
        assert during - base <= bound, (base, during, bound)
        # n more try to park a whole max_frame_bytes frame (1 MiB): closed at the size, their bytes never held
        with refused_frames(lambda i: node.tls(f"127.0.0.{2 + i % 8}"), n, MAX_FRAME, MAX_FRAME - 1,
                            "a connection parking a 1 MiB frame before authentication"):
            peak = max(node.rss() for _ in range(5))
            assert peak - base <= bound, (base, during, peak, bound)
        assert not any(closed(s) for s in parked)  # still parked: their deadline is far
    finally:
        close_all(parked)
    # all gone: the node hands back what they cost (malloc_trim once the connections closed)
    node.wait_connections(0)
    wait_for(lambda: node.rss() - base <= max(during - base, 0) // 2 + 4 * MiB, 10,
             what=f"the node's RSS to come back near {base} (during {during})")
    assert node.serves()


# ------------------------------------------------------------------------------------ ByteBudget
def test_the_byte_budget_holds_the_reader_while_unanswered_requests_fill_it():
    async def go():
        pauses = []
        budget = ByteBudget(100, on_pause=lambda: pauses.append(1))
        await budget.room(60)
        await budget.room(40)  # exactly full
        third = asyncio.ensure_future(budget.room(30))
        await asyncio.sleep(0)
        assert not third.done() and budget.pauses == 1 and pauses == [1]
        budget.release(20)  # 80 held: 30 more would pass 100
        await asyncio.sleep(0)
        assert not third.done()
        budget.release(60)  # 20 held
        await asyncio.wait_for(third, 1)
        assert budget.held == 50
        budget.release(50)
        await budget.room(1000)  # nothing held: one frame of any size passes
        assert budget.held == 1000 and budget.pauses == 1
    asyncio.run(go())
