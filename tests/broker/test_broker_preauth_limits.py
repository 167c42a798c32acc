"""What an unauthenticated peer can cost a SASL broker's Kafka listener (broker.frontend, quorum.security.limits),
as on the quorum's client port (tests/quorum/test_client_port_limits.py): the frame cap before
authentication, the authentication and TLS handshake deadlines, and the broker's memory under
connections parking partial frames; authenticated confluent-kafka producers served throughout.

The brokers run against the security suite's SASL_SSL quorum (``secure_quorum``, alice's ACLs of
tests/security/test_broker_auth.py), each started with the limits its tests need; the attacking
connections are raw sockets.
"""
from __future__ import annotations

import socket
import time

import pytest
from confluent_kafka import Producer

from benchmarks.processes import BrokerProcess
from quorum.localcluster import free_ports
from quorum.security.tls import client_context
from tests.broker.conftest import MeteredBroker
from tests.conftest import wait_for
from tests.quorum.test_client_port_limits import (
    PER_CONNECTION_OVERHEAD,
    PREAUTH_FRAME,
    _client_hello,
    check_unauthenticated_frame_cap,
    open_unauthenticated_and_wait_closed,
)
from tests.security.conftest import secure_quorum  # noqa: F401 - the fixture, shared with the security suite
from tests.security.test_broker_auth import ACLS, confluent_config
from tests.support.sockets import close_all, closed, refused_frames, trickle, unsent, wait_closed
from records.wire import kafka

KiB, MiB = 1024, 1024 * 1024
PARKED_FRAME = 2 * MiB  # far under max_frame_bytes (16 MiB), which was the only bound before authentication
AUTH_TIMEOUT_MS, TLS_TIMEOUT_MS = 3000, 2000  # the "deadlines" broker's


class Broker(MeteredBroker):
    """A SASL broker (inside TLS or not) with its metrics port, and ways to reach its listener."""

    def __init__(self, proc: BrokerProcess, metrics_port: int, tls: bool, pki):
        super().__init__(proc, metrics_port)
        self.tls, self.pki = tls, pki
        host, port = proc.bootstrap.rsplit(":", 1)
        self.host, self.port = host, int(port)

    def raw(self) -> socket.socket:
        """A TCP connection to the listener, nothing sent."""
        return socket.create_connection((self.host, self.port), timeout=10)

    def connect(self) -> socket.socket:
        """A connection ready for Kafka frames, not authenticated (TLS handshake done on a TLS listener)."""
        s = self.raw()
        return client_context(self.pki.cafile).wrap_socket(s, server_hostname="localhost") if self.tls else s

    def producer(self) -> Producer:
        """An idempotent confluent-kafka producer authenticated as alice."""
        brokers = {"tls": self, "plain": self, "pki": self.pki}
        return Producer({**confluent_config(brokers, "alice", tls=self.tls), "enable.idempotence": True})


def produced(producer: Producer, n: int = 5, topic: str = "secured-preauth") -> bool:
    """``n`` records sent and acknowledged without error."""
    errors: list = []
    for i in range(n):
        producer.produce(topic, value=str(i).encode(), on_delivery=lambda err, msg: errors.append(err))
    return producer.flush(30) == 0 and errors == [None] * n


@pytest.fixture(scope="module")
def sasl_broker(secure_quorum, tmp_path_factory):  # noqa: F811 - the imported fixture
    """``sasl_broker(name, tls, **settings)``: a SASL (SASL_SSL with ``tls``) broker with those settings,
    started once per module and name."""
    sq = secure_quorum
    sq.grant(ACLS)
    base = str(tmp_path_factory.mktemp("preauth-brokers"))
    started: dict[str, Broker] = {}

    def start(name: str, tls: bool, **settings) -> Broker:
        if name not in started:
            flags = sq.broker_flags()
            if tls:
                flags += ["--tls-certfile", sq.pki.certfile, "--tls-keyfile", sq.pki.keyfile]
            for key, value in settings.items():
                flags += [f"--{key.replace('_', '-')}", str(value)]
            metrics_port = free_ports(1)[0]
            proc = BrokerProcess(base, 10 + len(started), sq.addresses, "--metrics-port", str(metrics_port), *flags)
            started[name] = Broker(proc.start(), metrics_port, tls, sq.pki)
        return started[name]

    yield start
    for b in started.values():
        b.proc.stop()


# ------------------------------------------------------------------ frames before authentication
LONG = dict(authentication_timeout_ms=120_000, tls_handshake_timeout_ms=60_000)  # deadlines out of the way


def test_a_frame_over_the_unauthenticated_cap_closes_the_connection_before_its_body_is_read(sasl_broker):
    b = sasl_broker("plain", False, **LONG)
    check_unauthenticated_frame_cap(b.connect, lambda: b.counter("bad_frames"))
    # authenticated, a connection's frames may be up to max_frame_bytes: a producer's 900 KiB record
    p = b.producer()
    assert produced(p)
    errors: list = []
    p.produce("secured-preauth", value=b"x" * (900 * KiB), on_delivery=lambda err, msg: errors.append(err))
    assert p.flush(30) == 0 and errors == [None]
    del p  # its connections close
    assert "max_unauthenticated_frame_bytes" in b.log()


# ------------------------------------------------------------------------------------ deadlines
DEADLINES = dict(authentication_timeout_ms=AUTH_TIMEOUT_MS, tls_handshake_timeout_ms=TLS_TIMEOUT_MS)


@pytest.mark.parametrize("tls", [False, True], ids=["SASL_PLAINTEXT", "SASL_SSL"])
def test_connections_that_never_authenticate_are_closed_at_the_deadline(sasl_broker, tls):
    b = sasl_broker("deadlines-tls" if tls else "deadlines", tls, **DEADLINES)
    early = b.producer()  # authenticated before the attack: its connections outlive the deadline
    assert produced(early)
    before = b.counter("authentication_timeouts")
    t0 = time.monotonic()
    socks = []
    try:
        socks = open_unauthenticated_and_wait_closed(b.connect)
        elapsed = time.monotonic() - t0
        assert elapsed >= AUTH_TIMEOUT_MS / 1000 * 0.8, elapsed  # not closed before the deadline
        # authenticated producers are served meanwhile and after: a new one, and the one from before the
        # deadline (the 3 connections closed are the attackers')
        assert produced(b.producer())
        assert produced(early)
    finally:
        close_all(socks)
    wait_for(lambda: b.counter("authentication_timeouts") - before == 3, 10,
             what="3 authentication timeouts counted")
    assert "authentication_timeout_ms" in b.log()


def test_a_client_hello_trickled_a_byte_at_a_time_is_closed_at_the_handshake_deadline(sasl_broker):
    b = sasl_broker("deadlines-tls", True, **DEADLINES)
    hello = _client_hello()
    before = b.counter("authentication_timeouts")
    failures = b.counter("tls_handshake_failures")
    producer = b.producer()
    slow = [b.raw() for _ in range(20)]
    try:
        sent, elapsed = trickle(slow, hello, 15, "a trickled ClientHello kept its connection open")
        assert sent < len(hello) and elapsed >= TLS_TIMEOUT_MS / 1000 * 0.8, (sent, elapsed)
        assert produced(producer)  # served while (and after) the handshakes hang
    finally:
        close_all(slow)
    wait_for(lambda: b.counter("authentication_timeouts") - before == len(slow), 10,
             what=f"{len(slow)} handshake timeouts counted")
    # a handshake that fails outright (not TLS at all) is a failure, not a timeout
    s = b.raw()
    try:
        s.sendall(b"\x16\x03\x01\x00\x05hello" + b"\0" * 64)
        wait_closed(s, 10, "a connection sending garbage for a ClientHello")
    finally:
        s.close()
    wait_for(lambda: b.counter("tls_handshake_failures") - failures == 1, 10, what="a TLS handshake failure counted")


# ------------------------------------------------------------------------------------------ memory
def test_connections_parking_partial_frames_cost_at_most_the_unauthenticated_cap_each(sasl_broker):
    n = 100
    b = sasl_broker("plain", False, **LONG)
    for _ in range(3):  # warm up: SASL and the handlers have run, the heap has its working size
        close_all([b.connect() for _ in range(10)])
        assert produced(b.producer())
    b.idle()
    base = b.rss()
    parked = []
    try:
        # n connections, each parking a frame just under the cap before authentication
        for _ in range(n):
            s = b.connect()
            s.sendall(kafka.SIZE.pack(PREAUTH_FRAME) + b"\1" * (PREAUTH_FRAME - 1))
            parked.append(s)
        wait_for(lambda: all(unsent(s) == 0 for s in parked), 20, what="the broker to take the parked bytes")
        wait_for(lambda: b.counter("connections") >= n, 10, what=f"the broker to count {n} connections")
        during = max(b.rss() for _ in range(5))
        bound = n * (PREAUTH_FRAME + PER_CONNECTION_OVERHEAD)
        assert during - base <= bound, (base, during, bound)
        # n more try to park most of a 2 MiB frame (under max_frame_bytes): closed at the size, never held
        with refused_frames(lambda _: b.connect(), n, PARKED_FRAME, PARKED_FRAME // 2,
                            "a connection parking a 2 MiB frame before authentication"):
            peak = max(b.rss() for _ in range(5))
            assert peak - base <= bound, (base, during, peak, bound)
        assert not any(closed(s) for s in parked)  # still parked: their deadline is far
        assert produced(b.producer())  # and producers are served
    finally:
        close_all(parked)
    # all gone: the broker hands back what they cost (malloc_trim a second after connections close)
    b.idle()
    wait_for(lambda: b.rss() - base <= max(during - base, 0) // 4 + 1 * MiB, 10,
             what=f"the broker's RSS to come back near {base} (during {during})")
    print(f"broker RSS: base {base / MiB:.1f} MiB, {n} connections parking {PREAUTH_FRAME // KiB} KiB "
          f"{during / MiB:.1f} MiB, {n} more announcing {PARKED_FRAME // MiB} MiB {peak / MiB:.1f} MiB, "
          f"after {b.rss() / MiB:.1f} MiB (bound {bound / MiB:.1f} MiB over base)")
