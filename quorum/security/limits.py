"""What one peer may cost a listener before and after it authenticates: connection limits, a byte budget of
unanswered requests, the authentication deadline, and giving freed heap back to the system after
connections end.  The quorum's client port (``quorum.server``) uses them all; the broker
(``broker.frontend``) uses ``ConnectionLimits`` and ``TrimAfterClose`` and bounds its read-ahead itself."""
from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import sys
import time
from typing import Any, Callable

from quorum.telemetry.logs import Throttled
from records.wire import kafka

from .acl import peer_host

REFUSAL_LOG_INTERVAL_S = 10.0


class ConnectionLimits:
    """Open connections of one listener, in total and by client address (Kafka's max.connections and
    max.connections.per.ip).  A connection over either is refused at once (the caller aborts it, nothing
    read or answered), counted, and logged at most every ``log_interval_s``: a connection flood is a log
    line every 10 s, not one per connection."""

    def __init__(self, max_connections: int, max_connections_per_ip: int, counters: dict, logger: logging.Logger,
                 log_interval_s: float = REFUSAL_LOG_INTERVAL_S):
        self.max_connections, self.max_connections_per_ip = max_connections, max_connections_per_ip
        self.counters = counters
        for k in ("connections_refused", "connections_refused_per_ip"):
            counters.setdefault(k, 0)
        self.open = 0
        self._per_ip: dict[str | None, int] = {}
        self._log = Throttled(logger, log_interval_s)

    def admit(self, peer: Any) -> bool:
        """Room for one more connection from ``peer``?  Counted in when yes (``release`` it when it
        ends); a refusal is counted, and logged at most every ``log_interval_s``."""
        host = peer_host(peer)
        if self.open >= self.max_connections:
            self.counters["connections_refused"] += 1
            self._log(logging.WARNING, "client %s: refused, %d connections open (max_connections)", peer, self.open)
            return False
        held = self._per_ip.get(host, 0)
        if held >= self.max_connections_per_ip:
            self.counters["connections_refused"] += 1
            self.counters["connections_refused_per_ip"] += 1
            self._log(logging.WARNING, "client %s: refused, %d connections open from %s (max_connections_per_ip)",
                      peer, held, host)
            return False
        self._per_ip[host] = held + 1
        self.open += 1
        return True

    def release(self, peer: Any) -> None:
        """An admitted connection from ``peer`` has ended."""
        host = peer_host(peer)
        left = self._per_ip.get(host, 0) - 1
        if left > 0:
            self._per_ip[host] = left
        else:
            self._per_ip.pop(host, None)
        self.open = max(0, self.open - 1)

    def open_from(self, peer: Any) -> int:
        return self._per_ip.get(peer_host(peer), 0)


class ByteBudget:
    """Bytes of frames read from one connection and not yet answered, bounded by ``max_bytes``.

    ``room(size)`` waits while the bytes held plus ``size`` would pass ``max_bytes``, unless nothing is
    held (so one frame of any size the listener accepts gets through), then holds ``size``;
    ``release(size)`` gives it back once the frame is answered.  What one connection holds is then at
    most ``max(max_bytes, one frame)``, and a client that pipelines faster than it is answered stalls on
    TCP flow control, not in the server's memory.  Not thread-safe: the loop's thread only."""

    __slots__ = ("max_bytes", "held", "pauses", "_on_pause", "_waiter")

    def __init__(self, max_bytes: int, on_pause: Callable[[], None] | None = None):
        self.max_bytes = max_bytes
        self.held = 0
        self.pauses = 0
        self._on_pause = on_pause
        self._waiter: asyncio.Future | None = None  # the reader's, while it waits (one reader per connection)

    def _fits(self, size: int) -> bool:
        return self.held == 0 or self.held + size <= self.max_bytes

    async def room(self, size: int) -> None:
        if not self._fits(size):
            self.pauses += 1
            if self._on_pause is not None:
                self._on_pause()
            while not self._fits(size):
                self._waiter = asyncio.get_running_loop().create_future()
                try:
                    await self._waiter
                finally:
                    self._waiter = None
        self.held += size

    def release(self, size: int) -> None:
        self.held = max(0, self.held - size)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # glibc only (musl has no malloc_trim)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


_TRIM = _malloc_trim()


def release_freed_memory() -> bool:
    """Return the heap's free pages to the system (glibc ``malloc_trim(0)``: glibc keeps freed heap mapped
    otherwise, so the process's RSS stays at its peak after the connections are gone); False where it cannot.
    Measured on a quorum node: 0.1-0.2 ms when there is little to give back, 70 ms to give back the
    170 MB that 100 connections parking 1 MiB each had taken.  Call it once many connections may have
    ended (the quorum: at most once a second), not per connection."""
    if _TRIM is None:
        return False
    try:
        _TRIM(0)
    except Exception:  # noqa: BLE001 - an optimisation: never worth a failure
        return False
    return True


TRIM_DELAY_S = 1.0  # after a connection ends, the heap's free pages go back to the system this much later


class TrimAfterClose:
    """``soon()`` when a connection has ended: ``TRIM_DELAY_S`` later (once its transport and buffers are
    freed, and those of the connections that end with it) the heap's free pages go back to the system
    (``release_freed_memory``); at most one trim per delay however many connections end.  ``cancel()``
    when the listener stops.  Loop thread only."""

    def __init__(self, logger: logging.Logger, delay_s: float = TRIM_DELAY_S):
        self._log, self.delay_s = logger, delay_s
        self._handle: asyncio.TimerHandle | None = None
        self.trims = 0

    def soon(self) -> None:
        if self._handle is None:
            self._handle = asyncio.get_running_loop().call_later(self.delay_s, self._trim)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _trim(self) -> None:
        self._handle = None
        t0 = time.perf_counter()
        if release_freed_memory():
            self.trims += 1
            self._log.debug("malloc_trim: %.1f ms", (time.perf_counter() - t0) * 1000)


async def read_gated_frame(reader: asyncio.StreamReader, authenticated: bool, max_frame_bytes: int,
                           max_unauthenticated_bytes: int, room: Callable[[int], Any], expired: Callable[[], bool],
                           counters: dict, logger: logging.Logger, peer_log: Callable[..., None],
                           peer: Any) -> bytes | None:
    """A connection's next frame, bounded by what its peer may send now: ``max_frame_bytes`` once it
    authenticated, ``max_unauthenticated_bytes`` before (the size is checked before the body is read).
    None ends the connection: the stream ended, or a bad or oversized frame (counted in ``bad_frames``;
    logged through ``logger``, or before authentication through ``peer_log``, at most a line every 10 s,
    since anyone can send these).  After the authentication deadline closed the connection (``expired()``),
    a frame it cut is not a bad one."""
    max_bytes = max_frame_bytes if authenticated else max_unauthenticated_bytes
    try:
        return await kafka.read_frame(reader, max_bytes, room)
    except kafka.FrameError as e:
        if expired():
            return None
        counters["bad_frames"] += 1
        if authenticated:
            logger.warning("client %s: %s; closing", peer, e)
        else:
            peer_log(logging.WARNING, "client %s: before authentication: %s (max_unauthenticated_frame_bytes %d); "
                     "closing", peer, e, max_bytes)
        return None


class BeforeAuthentication:
    """What one connection may take before it authenticates: the authentication deadline (with SASL on, a
    connection not authenticated ``authentication_timeout_ms`` after its accept is aborted, whatever it
    trickles) and a bounded TLS handshake.  Made when the connection is accepted; ``expired`` says whether
    the deadline closed it (then what was cut is not an error of the peer's); ``cancel()`` when it ends."""

    def __init__(self, writer: asyncio.StreamWriter, session: Any, peer: Any, authentication_timeout_ms: int,
                 counters: dict, peer_log: Callable[..., None]):
        self._loop = asyncio.get_running_loop()
        self.accepted = self._loop.time()
        self.expired = False
        self._writer, self._session, self._peer = writer, session, peer
        self._timeout_ms, self._counters, self._peer_log = authentication_timeout_ms, counters, peer_log
        self._expiry = (self._loop.call_at(self.accepted + authentication_timeout_ms / 1000, self._expire)
                        if session is not None else None)

    def _expire(self) -> None:
        if self._session.authenticated or self._writer.transport.is_closing():
            return
        self.expired = True
        self._counters["authentication_timeouts"] += 1
        self._peer_log(logging.WARNING, "client %s: not authenticated %d ms after it connected "
                       "(authentication_timeout_ms); closing", self._peer, self._timeout_ms)
        self._writer.transport.abort()  # the TLS handshake's socket too, while it runs (start_tls then fails)

    async def start_tls(self, context: Any, timeout_ms: int) -> bool:
        """TLS on the accepted socket, the handshake done within ``timeout_ms`` (a ClientHello trickled a byte
        at a time included).  False: it failed or timed out (counted, logged at most every 10 s); the
        connection is done."""
        timeout = timeout_ms / 1000
        try:
            await self._writer.start_tls(context, ssl_handshake_timeout=timeout)
        except (OSError, asyncio.TimeoutError) as e:  # ssl.SSLError is an OSError
            if not self.expired:
                timed_out = isinstance(e, ConnectionAbortedError) and self._loop.time() - self.accepted >= timeout * 0.9
                self._counters["authentication_timeouts" if timed_out else "tls_handshake_failures"] += 1
                self._peer_log(logging.INFO, "client %s: TLS handshake %s: %s", self._peer,
                               "timed out (tls_handshake_timeout_ms)" if timed_out else "failed", e)
            return False
        return True

    def cancel(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
