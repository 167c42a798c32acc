"""The Raft port's TCP connections (``Link``) and listener (``LinkServer``), bounded against peers that do
not hold the cluster secret: every message's size bounded before it is read, a per-readiness read limit,
handshake and idle deadlines, an accept rate.  pysyncobj's ``TcpConnection`` and ``TcpServer`` let anyone
who reaches the port cost a leader its leadership; the message format stays pysyncobj's, byte for byte.
Nothing here imports pysyncobj.  Details: ``docs/durability.md`` ("The Raft port's links").
"""
from __future__ import annotations

import errno
import logging
import socket
import struct
import time
import zlib
from dataclasses import dataclass
from typing import Any, Callable

from .linkcrypto import MessagePickle, MessageZlib
from .looppoller import ERROR, READ, WRITE

log = logging.getLogger(__name__)

DISCONNECTED, CONNECTING, CONNECTED = 0, 1, 2  # pysyncobj's CONNECTION_STATE
_LENGTH = struct.Struct("i")  # pysyncobj's framing: a native-order signed 32-bit length
_AGAIN = (errno.EAGAIN, errno.EWOULDBLOCK)
_REFUSAL_LOG_S = 10.0


@dataclass(frozen=True)
class LinkLimits:
    """What a Raft connection may cost (``quorum.raft.RaftConfig`` holds the operator's values)."""

    max_message_bytes: int = 32 * 2**20  # one message from a peer that proved the secret
    handshake_bytes: int = 4096  # one message before that (the handshake's are about 200 bytes)
    handshake_timeout: float = 2.0  # seconds from the connection's opening to its proof of the secret
    read_per_event: int = 256 * 1024  # bytes read from one connection per readiness
    max_pending: int = 64  # unauthenticated incoming connections at once, in all
    max_pending_per_host: int = 8  # ... from one peer host
    listen_backlog: int = 1024
    accepts_per_event: int = 32
    accept_rate: float = 200.0  # new connections taken per second (a burst of accept_burst); the rest wait queued
    accept_burst: int = 64


class _Throttled:
    """Log a refusal at most once every 10 s per key, counting the rest."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, int]] = {}

    def warning(self, key: str, fmt: str, *args: Any) -> None:
        now = time.monotonic()
        last, skipped = self._last.get(key, (-1e18, 0))
        if now - last < _REFUSAL_LOG_S:
            self._last[key] = (last, skipped + 1)
            return
        if len(self._last) > 1024:
            self._last.clear()
        self._last[key] = (now, 0)
        log.warning(fmt + (f" ({skipped} more like it not logged)" if skipped else ""), *args)


refusals = _Throttled()


def _keepalive(sock: socket.socket, keepalive: tuple[int, int, int] | None) -> None:
    if keepalive is None or not hasattr(socket, "TCP_KEEPIDLE"):
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, keepalive[0])
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, keepalive[1])
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, keepalive[2])


class Link:
    """One Raft connection, with pysyncobj's ``TcpConnection`` interface (see the module's text)."""

    def __init__(self, poller: Any, limits: LinkLimits, sock: socket.socket | None = None, timeout: float = 10.0,
                 send_buffer: int = 2**16, recv_buffer: int = 2**16,
                 keepalive: tuple[int, int, int] | None = None, peer: str = "?", counters: dict | None = None):
        # pysyncobj's handshake fields (its transport and quorum.linkcrypto read and set them)
        self.sendRandKey: bytes | None = None
        self.recvRandKey: bytes | None = None
        self.recvLastTimestamp = 0
        self.encryptor: Any = None

        self.limits = limits
        self.counters = counters if counters is not None else {}  # "refused_messages": closed for what was sent
        self.peer = peer  # "host:port" of the other end, for logs and per-host limits
        self.authenticated = False
        self.opened_at = time.monotonic()
        self._poller = poller
        self._timeout = timeout
        self._send_buffer = send_buffer
        self._recv_buffer = recv_buffer
        self._keepalive = keepalive
        self._rbuf = bytearray()
        self._wbuf = bytearray()
        self._last_read = self.opened_at
        self._on_message: Callable[[Any], None] | None = None
        self._on_connected: Callable[[], None] | None = None
        self._on_disconnected: Callable[[], None] | None = None
        self._socket = sock
        self._fileno: int | None = None
        self._state = DISCONNECTED
        if sock is not None:
            self._fileno = sock.fileno()
            self._state = CONNECTED
            _keepalive(sock, keepalive)
            poller.subscribe(self._fileno, self._on_event, READ | WRITE | ERROR)

    @property
    def peer_host(self) -> str:
        return self.peer.rsplit(":", 1)[0]

    # ------------------------------------------------------------ pysyncobj's interface
    def setOnConnectedCallback(self, callback: Callable[[], None]) -> None:  # noqa: N802
        self._on_connected = callback

    def setOnMessageReceivedCallback(self, callback: Callable[[Any], None]) -> None:  # noqa: N802
        self._on_message = callback

    def setOnDisconnectedCallback(self, callback: Callable[[], None]) -> None:  # noqa: N802
        self._on_disconnected = callback

    @property
    def state(self) -> int:
        return self._state

    def fileno(self) -> int | None:
        return self._fileno

    def getSendBufferSize(self) -> int:  # noqa: N802
        return len(self._wbuf)

    def connect(self, host: str | None, port: int) -> bool:
        if host is None:
            return False
        self._state = DISCONNECTED
        self._fileno = None
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._send_buffer)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._recv_buffer)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _keepalive(sock, self._keepalive)
        sock.setblocking(False)
        self._socket = sock
        self.peer = f"{host}:{port}"
        self.authenticated = False
        self._rbuf = bytearray()
        self._wbuf = bytearray()
        self.opened_at = self._last_read = time.monotonic()
        try:
            sock.connect((host, port))
        except OSError as e:
            if e.errno not in (errno.EINPROGRESS,) + _AGAIN:
                sock.close()
                self._socket = None
                return False
        self._fileno = sock.fileno()
        self._state = CONNECTING
        self._poller.subscribe(self._fileno, self._on_event, READ | WRITE | ERROR)
        return True

    def send(self, message: Any) -> None:
        if self.sendRandKey:
            message = (self.sendRandKey, message)
        data = MessageZlib.compress(MessagePickle.dumps(message), 3)
        if self.encryptor:
            data = self.encryptor.encrypt_at_time(data, int(time.monotonic()))
        self._wbuf += _LENGTH.pack(len(data))
        self._wbuf += data
        self._try_send()

    def disconnect(self) -> None:
        notify = self._on_disconnected is not None and self._state != DISCONNECTED
        self.sendRandKey = None
        self.recvRandKey = None
        self.recvLastTimestamp = 0
        self.authenticated = False
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        if self._fileno is not None:
            self._poller.unsubscribe(self._fileno)
            self._fileno = None
        self._wbuf = bytearray()
        self._rbuf = bytearray()
        self._state = DISCONNECTED
        if notify:
            self._on_disconnected()

    # ------------------------------------------------------------ limits
    def expired(self, now: float) -> str | None:
        """Why this connection should be closed now (None: it should not)."""
        if self._state == DISCONNECTED:
            return None
        if not self.authenticated and now - self.opened_at > self.limits.handshake_timeout:
            return f"no proof of the cluster secret within {self.limits.handshake_timeout:g} s"
        if now - self._last_read > self._timeout:
            return f"nothing read for {self._timeout:g} s"
        return None

    def _limit(self) -> int:
        return self.limits.max_message_bytes if self.authenticated else self.limits.handshake_bytes

    def _refuse(self, why: str) -> None:
        self.counters["refused_messages"] = self.counters.get("refused_messages", 0) + 1
        refusals.warning(self.peer_host, "closing the Raft connection of %s: %s", self.peer, why)
        self.disconnect()

    # ------------------------------------------------------------ events
    def _on_event(self, descr: int, event: int) -> None:
        if descr != self._fileno:
            self._poller.unsubscribe(descr)
            return
        if event & ERROR:
            self.disconnect()
            return
        if time.monotonic() - self._last_read > self._timeout:
            self.disconnect()
            return
        if self._state == CONNECTING:
            if self._socket.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                self.disconnect()
                return
            if self._on_connected is not None:
                self._on_connected()
            if self._state == DISCONNECTED:
                return
            self._state = CONNECTED
            self._last_read = time.monotonic()
            return
        if event & WRITE:
            self._try_send()
            if self._state == DISCONNECTED:
                return
            self._poller.subscribe(descr, self._on_event, READ | ERROR | (WRITE if self._wbuf else 0))
        if event & READ:
            self._read()
            while self._state != DISCONNECTED:
                message = self._next_message()
                if message is _NONE:
                    break
                if self._on_message is not None:
                    self._on_message(message)

    def _try_send(self) -> None:
        if time.monotonic() - self._last_read > self._timeout:
            self.disconnect()
            return
        while self._wbuf and self._state != DISCONNECTED:
            try:
                sent = self._socket.send(self._wbuf)
            except OSError as e:
                if e.errno not in _AGAIN:
                    self.disconnect()
                return
            if sent <= 0:
                return
            del self._wbuf[:sent]

    def _read(self) -> None:
        budget = self.limits.read_per_event
        if not self.authenticated:
            # At most two handshake messages are ever needed before the proof: hold no more than that.
            budget = min(budget, 2 * (self.limits.handshake_bytes + _LENGTH.size) - len(self._rbuf))
        got = 0
        while got < budget:
            try:
                data = self._socket.recv(min(self._recv_buffer, budget - got))
            except OSError as e:
                if e.errno not in _AGAIN:
                    self.disconnect()
                break
            if not data:
                self.disconnect()
                return
            self._rbuf += data
            got += len(data)
        if got:
            self._last_read = time.monotonic()

    def _next_message(self) -> Any:
        buf = self._rbuf
        if len(buf) < _LENGTH.size:
            return _NONE
        (size,) = _LENGTH.unpack_from(buf)
        if size < 0 or size > self._limit():
            stage = "a peer that proved the cluster secret" if self.authenticated else "before the handshake"
            self._refuse(f"a message of {size} bytes announced, {stage} at most {self._limit()}")
            return _NONE
        end = _LENGTH.size + size
        if len(buf) < end:
            return _NONE
        data = bytes(memoryview(buf)[_LENGTH.size:end])
        del buf[:end]
        try:
            if self.encryptor:
                stamp = self.encryptor.extract_timestamp(data)
                if stamp < self.recvLastTimestamp:
                    raise ValueError("an older timestamp than the last message's")
                self.recvLastTimestamp = stamp
                data = self.encryptor.decrypt(data)
            inflater = zlib.decompressobj()
            data = inflater.decompress(data, self.limits.max_message_bytes)
            if inflater.unconsumed_tail or not inflater.eof:
                raise ValueError(f"inflates to more than {self.limits.max_message_bytes} bytes or is cut")
            message = MessagePickle.loads(data)
            if self.recvRandKey:
                rand_key, message = message
                if rand_key != self.recvRandKey:
                    raise ValueError("not this connection's handshake")
                self.authenticated = True
            elif not self.encryptor:
                self.authenticated = True  # no secret (a test's node): nothing to prove
        except Exception as e:  # noqa: BLE001 - anything a peer sends that is not a message of this link
            why = "it failed the cluster secret's check" if not self.authenticated else f"unreadable ({e})"
            self._refuse(f"a message {why}" + ("" if self.authenticated else
                                                 ": a peer with another secret, or not a pidquorum node"))
            return _NONE
        return message


_NONE = object()  # no (further) message in the buffer


class LinkServer:
    """pysyncobj's ``TcpServer`` (bind, unbind) with a real backlog and several accepts per readiness."""

    def __init__(self, poller: Any, host: str, port: int, on_new_connection: Callable[[Link], None],
                 limits: LinkLimits, timeout: float, send_buffer: int = 2**16, recv_buffer: int = 2**16,
                 keepalive: tuple[int, int, int] | None = None, counters: dict | None = None):
        self._poller = poller
        self._host = host
        self._port = int(port)
        self._on_new = on_new_connection
        self._limits = limits
        self._timeout = timeout
        self._send_buffer = send_buffer
        self._recv_buffer = recv_buffer
        self._keepalive = keepalive
        self._counters = counters if counters is not None else {}  # "accepted", "accept_pauses"
        self._socket: socket.socket | None = None
        self._fileno: int | None = None
        self._tokens = float(limits.accept_burst)
        self._refilled = time.monotonic()
        self._paused = False
        self.bind_error: OSError | None = None  # the last bind's, for the one line a node stops with

    def _take_token(self, now: float) -> bool:
        rate, burst = self._limits.accept_rate, self._limits.accept_burst
        self._tokens = min(float(burst), self._tokens + (now - self._refilled) * rate)
        self._refilled = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    def resume(self, now: float) -> None:
        """Back on the loop once a token is due (the transport calls this at every tick)."""
        if self._paused and self._fileno is not None and \
                self._tokens + (now - self._refilled) * self._limits.accept_rate >= 1.0:
            self._paused = False
            self._poller.subscribe(self._fileno, self._on_event, READ | ERROR)

    def bind(self) -> None:
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._send_buffer)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._recv_buffer)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setblocking(False)
            sock.bind((self._host, self._port))
            sock.listen(self._limits.listen_backlog)
        except OSError as e:
            sock.close()
            self.bind_error = e
            raise
        self._socket = sock
        self._fileno = sock.fileno()
        self._poller.subscribe(self._fileno, self._on_event, READ | ERROR)

    def unbind(self) -> None:
        if self._fileno is not None:
            self._poller.unsubscribe(self._fileno)
            self._fileno = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    def _on_event(self, descr: int, event: int) -> None:
        if event & READ:
            for _ in range(self._limits.accepts_per_event):
                if not self._take_token(time.monotonic()):
                    self._paused = True
                    self._counters["accept_pauses"] = self._counters.get("accept_pauses", 0) + 1
                    self._poller.unsubscribe(self._fileno)
                    refusals.warning("accept-rate", "the Raft port takes at most %g new connections a second "
                                     "(accept_rate); the rest wait in the listen queue", self._limits.accept_rate)
                    return
                try:
                    sock, addr = self._socket.accept()
                except OSError as e:
                    if e.errno not in _AGAIN + (errno.ECONNABORTED, errno.EMFILE, errno.ENFILE, errno.ENOBUFS,
                                                errno.ENOMEM):
                        self.unbind()
                    elif e.errno not in _AGAIN:
                        refusals.warning("accept", "the Raft port cannot accept a connection: %s", e.strerror)
                    return
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._send_buffer)
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._recv_buffer)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    sock.setblocking(False)
                except OSError:
                    sock.close()
                    continue
                self._counters["accepted"] = self._counters.get("accepted", 0) + 1
                peer = f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) else str(addr)
                self._on_new(Link(self._poller, self._limits, sock, self._timeout, self._send_buffer,
                                  self._recv_buffer, self._keepalive, peer, self._counters))
        if event & ERROR:
            self.unbind()
