"""Raw client sockets against a server's limits: whether and when the server closed them, what it has
not taken yet, and connections that announce a frame the server must refuse at its size."""
from __future__ import annotations

import contextlib
import fcntl
import select
import socket
import ssl
import struct
import termios
import time

from records.wire import kafka


def closed(sock: socket.socket) -> bool:
    """Whether the server has closed ``sock`` (end of stream, or a reset); reads what it was sent meanwhile
    (answers, TLS 1.3 session tickets), without waiting."""
    timeout = sock.gettimeout()
    sock.setblocking(False)
    try:
        while True:
            try:
                if not sock.recv(65536):
                    return True
            except (ssl.SSLWantReadError, BlockingIOError):
                return False
    except OSError:  # a reset, a TLS error (ssl.SSLError is one)
        return True
    finally:
        sock.settimeout(timeout)


def wait_closed(sock: socket.socket, timeout: float, what: str) -> float:
    """Seconds until the server closed ``sock``; AssertionError after ``timeout``."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    while not closed(sock):
        if time.monotonic() > deadline:
            raise AssertionError(f"the node did not close {what} within {timeout}s")
        select.select([sock], [], [], 0.05)  # wait for something to read (the close), or 50 ms
    return time.monotonic() - t0


def unsent(sock: socket.socket) -> int:
    """Bytes of ``sock``'s sends the peer has not acknowledged yet (Linux SIOCOUTQ)."""
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]


def trickle(socks, data: bytes, timeout: float, what: str, meanwhile=None) -> tuple[int, float]:
    """Send ``data`` to each of ``socks`` a byte every 100 ms until the server has closed them all; AssertionError
    ``what`` after ``timeout`` seconds.  ``meanwhile()``, if given, must hold before every round.  Returns the
    bytes sent to each and the seconds it took."""
    t0 = time.monotonic()
    sent = 0
    while not all(closed(s) for s in socks):
        assert time.monotonic() - t0 < timeout, what
        if meanwhile is not None:
            assert meanwhile(), "not served while the connections were trickled"
        for s in socks:
            try:
                s.sendall(data[sent:sent + 1])
            except OSError:
                pass  # closed: the next closed() sees it
        sent += 1
        select.select(socks, [], [], 0.1)
    return sent, time.monotonic() - t0


def close_all(socks) -> None:
    for s in socks:
        try:
            s.close()
        except OSError:
            pass


@contextlib.contextmanager
def refused_frames(connect, n: int, frame: int, send: int, what: str):
    """``n`` connections (``connect(i)``), each announcing a frame of ``frame`` bytes and sending ``send`` bytes
    of it before authentication, each closed by the server within 10 s (``what`` names one in the error);
    the body runs while they are gone from the server, and they are closed here on the way out."""
    big = []
    try:
        for i in range(n):
            s = connect(i)
            try:
                s.sendall(kafka.SIZE.pack(frame) + b"\1" * send)
            except OSError:
                pass  # the server closed it under the send
            big.append(s)
        for s in big:
            wait_closed(s, 10, what)
        yield
    finally:
        close_all(big)
