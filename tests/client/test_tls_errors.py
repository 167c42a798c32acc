"""A client whose TLS settings do not fit the quorum's port gets one line naming each node and why, at once
(a certificate it does not trust, one that does not name the address dialled, TLS on one end only): no try
can cure that.  What a retry can cure (a node down, refused, closed) is still retried until --timeout.  The
same for a broker: it refuses to start (exit 78) naming why, or, when the quorum is only down, keeps trying.

pidctl runs through click's CliRunner on cli.main.cli; brokers are processes (``pidctl broker start``)."""
from __future__ import annotations

import os
import re
import socket
import ssl
import subprocess
import sys
import threading
import time

import pytest
from click.testing import CliRunner

from benchmarks.pki import make_pki
from cli.common import EXIT_ERROR, EXIT_UNAVAILABLE
from cli.main import cli
from quorum.localcluster import LocalCluster, free_ports
from tests.conftest import wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PIDCTL = [sys.executable, "-m", "cli.main"]
LONG = 60.0  # --timeout of the calls that must fail at once: the old client waited all of it
AT_ONCE = 20.0  # "at once": well before LONG, with room for a loaded machine
UNTRUSTED = ("TLS certificate verify failed (self-signed certificate in certificate chain): pass --tls-cafile "
             "with the CA that signed the quorum's certificates")


@pytest.fixture(scope="module")
def tls_quorum(tmp_path_factory):
    """A three-node quorum serving TLS on its client ports: (LocalCluster, Pki)."""
    base = tmp_path_factory.mktemp("tls")
    pki = make_pki(str(base / "pki"))
    lc = LocalCluster(str(base / "cluster"))
    lc.up(3, tls_certfile=pki.certfile, tls_keyfile=pki.keyfile, tls_cafile=pki.cafile)
    try:
        yield lc, pki
    finally:
        lc.down(timeout=5)


def pidctl(*args: str) -> tuple[int, str, float]:
    """(exit code, output, seconds) of pidctl with ``args``."""
    t0 = time.monotonic()
    r = CliRunner().invoke(cli, list(args))
    return r.exit_code, r.output, time.monotonic() - t0


def one_line(text: str) -> str:
    lines = [x for x in text.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


def test_no_ca_fails_at_once_naming_every_node_and_the_fix(tls_quorum):
    lc, _ = tls_quorum
    q = ",".join(lc.client_addresses())
    rc, out, took = pidctl("--quorum", q, "--security-protocol", "SSL", "--timeout", str(LONG),
                           "broker", "register", "--broker-id", "9")
    assert rc == EXIT_UNAVAILABLE, out
    assert one_line(out) == f"error: no node answered: {', '.join(lc.client_addresses())}: {UNTRUSTED}"
    assert took < AT_ONCE, f"took {took:.1f}s: retried a certificate no try can make trusted"


def test_the_wrong_ca_fails_at_once_too(tls_quorum, tmp_path):
    lc, _ = tls_quorum
    other = make_pki(str(tmp_path / "other"))
    rc, out, took = pidctl("--quorum", lc.client_addresses()[0], "--security-protocol", "SSL", "--tls-cafile",
                           other.cafile, "--timeout", str(LONG), "allocate", "--broker-id", "9", "--broker-epoch", "1")
    assert rc == EXIT_UNAVAILABLE and took < AT_ONCE, (rc, out, took)
    line = one_line(out)
    assert line.startswith(f"error: no node answered: {lc.client_addresses()[0]}: TLS certificate verify failed ("), line
    assert line.endswith("): pass --tls-cafile with the CA that signed the quorum's certificates"), line


def test_plaintext_on_the_tls_port_is_told_it_is_a_tls_port(tls_quorum):
    lc, _ = tls_quorum
    rc, out, took = pidctl("--quorum", ",".join(lc.client_addresses()), "--timeout", str(LONG),
                           "broker", "register", "--broker-id", "9")
    assert rc == EXIT_UNAVAILABLE and took < AT_ONCE, (rc, out, took)
    assert one_line(out) == (f"error: no node answered: {', '.join(lc.client_addresses())}: closed the connection "
                             f"without an answer: it is a TLS port (--security-protocol SSL)")


def test_with_the_ca_it_works(tls_quorum):
    lc, pki = tls_quorum
    rc, out, _ = pidctl("--quorum", ",".join(lc.client_addresses()), "--security-protocol", "SSL", "--tls-cafile",
                        pki.cafile, "--timeout", "30", "broker", "register", "--broker-id", "9")
    assert rc == 0 and out.strip().isdigit(), out


# ------------------------------------------------------------------ servers that are not a quorum node
class Server:
    """A TCP server on 127.0.0.1 in a thread: ``handle(conn)`` for each connection, then the close."""

    def __init__(self, handle):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.handle, self.accepted = handle, 0
        self._stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        self.sock.settimeout(0.1)
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except (socket.timeout, OSError):
                continue
            self.accepted += 1
            with conn:
                try:
                    self.handle(conn)
                except (OSError, ssl.SSLError):
                    pass

    def close(self):
        self._stop = True
        self.thread.join(5)
        self.sock.close()


@pytest.fixture
def server():
    started = []

    def start(handle) -> Server:
        started.append(Server(handle))
        return started[-1]
    yield start
    for s in started:
        s.close()


def test_a_certificate_without_the_address_dialled_is_named(tls_quorum, server):
    """The test CA's client certificate has no subjectAltName: served by a TLS port, the CA is trusted but the
    certificate does not name 127.0.0.1."""
    _, pki = tls_quorum
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki.client_certfile, pki.client_keyfile)
    srv = server(lambda conn: ctx.wrap_socket(conn, server_side=True).recv(1))
    rc, out, took = pidctl("--quorum", srv.address, "--security-protocol", "SSL", "--tls-cafile", pki.cafile,
                           "--timeout", str(LONG), "broker", "register", "--broker-id", "9")
    assert rc == EXIT_UNAVAILABLE and took < AT_ONCE, (rc, out, took)
    assert one_line(out) == (f"error: no node answered: {srv.address}: TLS certificate verify failed (IP address "
                             f"mismatch, certificate is not valid for '127.0.0.1'): the node's certificate must name "
                             f"127.0.0.1 in its subjectAltName, or dial a name it has")


def test_a_tls_alert_to_a_plaintext_request_says_tls(server):
    """A server answering a Kafka request with a TLS alert record (protocol_version): the bytes say TLS."""
    def alert(conn):
        conn.recv(4096)
        conn.sendall(bytes([0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x46]))
    srv = server(alert)
    rc, out, took = pidctl("--quorum", srv.address, "--timeout", str(LONG), "broker", "register", "--broker-id", "9")
    assert rc == EXIT_UNAVAILABLE and took < AT_ONCE, (rc, out, took)
    assert one_line(out) == (f"error: no node answered: {srv.address}: answered in TLS: it is a TLS port "
                             f"(--security-protocol SSL)")


def test_a_close_without_an_answer_claims_nothing_and_is_tried_again(server):
    """Closed without a byte by a server that does not speak TLS either (a node going down does that): no
    claim of TLS, and tried again until --timeout, as a node restarting must be."""
    srv = server(lambda conn: conn.recv(4096))
    rc, out, took = pidctl("--quorum", srv.address, "--timeout", "2", "broker", "register", "--broker-id", "9")
    assert rc == EXIT_UNAVAILABLE, out
    assert one_line(out) == f"error: no node answered within 2.0s: {srv.address}: closed the connection before answering"
    assert took >= 2 and srv.accepted >= 3, (took, srv.accepted)


def test_a_refused_connection_is_tried_again_until_the_timeout():
    (port,) = free_ports(1)
    rc, out, took = pidctl("--quorum", f"127.0.0.1:{port}", "--timeout", "2", "broker", "register", "--broker-id", "9")
    assert rc == EXIT_UNAVAILABLE and took >= 2, (rc, out, took)
    assert one_line(out) == f"error: no node answered within 2.0s: 127.0.0.1:{port}: Connection refused"


def test_tls_on_a_port_without_tls_is_told_so(tmp_path):
    lc = LocalCluster(str(tmp_path / "plain"))
    lc.up(1)
    try:
        (address,) = lc.client_addresses()
        rc, out, took = pidctl("--quorum", address, "--security-protocol", "SSL", "--timeout", str(LONG),
                               "broker", "register", "--broker-id", "9")
        assert rc == EXIT_UNAVAILABLE and took < AT_ONCE, (rc, out, took)
        assert one_line(out) == (f"error: no node answered: {address}: closed the connection during the TLS handshake: "
                                 f"it is a port without TLS (--security-protocol PLAINTEXT)")
    finally:
        lc.down(timeout=5)


# ------------------------------------------------------------------ brokers
def broker(tmp_path, quorum: str, *flags: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*PIDCTL, "broker", "start", "--broker-id", "2", "--quorum", quorum, "--listen",
                           "127.0.0.1:0", "--data-dir", str(tmp_path / "broker-2"), *flags],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def critical(stderr: str) -> str:
    """The broker's one CRITICAL line, without its time stamp."""
    lines = [x for x in stderr.splitlines() if " CRITICAL " in x]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0].split(" CRITICAL ", 1)[1]


@pytest.mark.parametrize("flags, why", [
    ((), 'closed the connection without an answer: it is a TLS port (security_protocol = "SSL" in [quorum_security])'),
    (("--quorum-security-protocol", "SSL"),
     "TLS certificate verify failed (self-signed certificate in certificate chain): pass tls_cafile in "
     "[quorum_security] with the CA that signed the quorum's certificates"),
])
def test_a_broker_that_cannot_reach_the_quorum_over_tls_says_why_and_stops(tls_quorum, tmp_path, flags, why):
    """Was: 'registration failed: ... IncompleteReadError' (or the certificate error) every 5 s, then exit 69
    after 30 s saying only 'no producer-ID block'."""
    lc, _ = tls_quorum
    t0 = time.monotonic()
    r = broker(tmp_path, ",".join(lc.client_addresses()), *flags)
    assert r.returncode == 78, (r.returncode, r.stderr)
    assert critical(r.stderr) == (f"pidquorum.broker [broker=2]: refusing to start: no quorum node answered: "
                                  f"{', '.join(lc.client_addresses())}: {why}")
    assert time.monotonic() - t0 < AT_ONCE


def test_a_broker_given_a_ca_without_tls_is_refused(tmp_path, tls_quorum):
    """tls_cafile with security_protocol PLAINTEXT was ignored in silence (the broker spoke plaintext)."""
    _, pki = tls_quorum
    cfg = tmp_path / "broker.toml"
    cfg.write_text(f'broker_id = 2\nquorum = ["127.0.0.1:1"]\n\n[quorum_security]\ntls_cafile = "{pki.cafile}"\n')
    r = subprocess.run([*PIDCTL, "broker", "start", "--config", str(cfg)], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == EXIT_ERROR, (r.returncode, r.stdout, r.stderr)
    assert one_line(r.stdout + r.stderr) == (
        f"error: {cfg}: quorum_security: tls_cafile is set but security_protocol is PLAINTEXT (no TLS, the CA would "
        f"not be used): set security_protocol = \"SSL\", or remove tls_cafile")


def test_a_broker_still_waits_for_a_quorum_that_is_down(tmp_path):
    """Nodes down at the broker's start: it says so and tries again; it serves once a node is up."""
    lc = LocalCluster(str(tmp_path / "plain"))
    lc.up(1)
    lc.down(timeout=5)
    (address,) = lc.client_addresses()
    ready = tmp_path / "broker.ready"
    log = open(tmp_path / "broker.log", "w+")
    proc = subprocess.Popen([*PIDCTL, "broker", "start", "--broker-id", "2", "--quorum", address, "--listen",
                             "127.0.0.1:0", "--data-dir", str(tmp_path / "broker-2"), "--ready-file", str(ready)],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "no quorum node answered" in open(log.name).read() or proc.poll() is not None, 30,
                 what="the broker to say the quorum does not answer")
        assert proc.poll() is None, open(log.name).read()
        assert re.search(rf"no quorum node answered: {address}: Connection refused \(trying again\)",
                         open(log.name).read()), open(log.name).read()
        lc.start(1)
        wait_for(lambda: ready.exists() and ready.stat().st_size or proc.poll() is not None, 30,
                 what="the broker to serve once the node is up")
        assert proc.poll() is None, open(log.name).read()
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(15)
        log.close()
        lc.down(timeout=5)
