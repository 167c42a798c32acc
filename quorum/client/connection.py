"""One connection to a quorum node's client port: requests multiplexed by correlation id, TLS and SASL as
the client's security says, and errors that name the node, the reason and the setting that fixes it
(``SettingNames``).  A node that no retry can reach with these settings raises ``HandshakeFailed``."""
from __future__ import annotations

import asyncio
import itertools
import os
import ssl
from dataclasses import dataclass
from typing import Any

from quorum.security.client import authenticate
from records.wire import kafka
from records.wire.errors import PidQuorumError, RequestTimedOutError

from . import api
from .retry import result_within

TLS_PROBE_TIMEOUT_S = 2.0  # the handshake that tells a TLS port (a plaintext connection closed without a byte)


def _current_task() -> asyncio.Task | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running loop
        return None


class ConnectionFailed(Exception):
    """Could not reach the node, or it closed the connection."""


class HandshakeFailed(ConnectionFailed):
    """The node cannot be reached with this client's settings, and another try cannot change that: its TLS
    certificate is not trusted or does not name the address dialled, or one end speaks TLS and the other not."""


@dataclass(frozen=True)
class SettingNames:
    """How the program using the client names the settings that fix a failed connection (pidctl's flags by
    default; a broker names its ``[quorum_security]`` keys), for the hints in its errors."""

    tls: str = "--security-protocol SSL"
    plaintext: str = "--security-protocol PLAINTEXT"
    cafile: str = "--tls-cafile"


# OpenSSL's X509_V_ERR_* codes for a chain without a trusted issuer (the CA is not the one given; 7: a CA of the
# same name that did not sign it), for a certificate that does not name the host or IP address dialled, and for
# one out of its validity.
_UNTRUSTED = frozenset({2, 7, 18, 19, 20, 21})
_NAME_MISMATCH = frozenset({62, 64})
_EXPIRED = frozenset({9, 10})


def os_reason(e: BaseException) -> str:
    """An OSError as a few words: the system's text for its errno (not asyncio's "Connect call failed
    ('127.0.0.1', 9092)"), else its own, else its type."""
    if isinstance(e, asyncio.TimeoutError):
        return "no connection within the deadline"
    errno = getattr(e, "errno", None)
    if isinstance(errno, int) and errno > 0 and not isinstance(e, ssl.SSLError):
        return os.strerror(errno)
    return str(e) or type(e).__name__


def _looks_like_tls(head: bytes) -> bool:
    """The first bytes of a TLS record (alert 0x15 or handshake 0x16, then major version 3): a TLS server's
    answer to bytes that are no ClientHello.  As a Kafka frame size it would be above 352 MB."""
    return len(head) >= 2 and head[0] in (0x15, 0x16) and head[1] == 0x03


async def _speaks_tls(host: str, port: int, timeout: float) -> bool:
    """Whether a TLS handshake with ``host:port`` completes (the certificate unchecked: only the protocol is
    asked).  For a plaintext connection the node closed without a byte: a TLS port does that."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port, ssl=ctx), timeout)
    except (OSError, asyncio.TimeoutError):
        return False
    writer.close()
    return True


async def _speaks_plaintext(host: str, port: int, timeout: float) -> bool:
    """Whether ``host:port`` answers an ApiVersions request sent without TLS.  For a TLS handshake the node
    ended at once: a port without TLS does that (it takes the ClientHello for an oversized request)."""
    writer = None
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        writer.write(kafka.encode_request(kafka.request_entity(kafka.API_VERSIONS, 0), 1, "pidquorum"))
        head = await asyncio.wait_for(reader.readexactly(8), timeout)
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
        return False
    finally:
        if writer is not None:
            writer.close()
    return kafka.SIZE.unpack_from(head, 4)[0] == 1  # the correlation id sent


class Connection:
    def __init__(self, address: str, client_id: str = "pidquorum", security: Any = None,
                 names: SettingNames | None = None):
        self.address = address
        self.client_id = client_id
        self.security = security  # quorum.security.client.ClientSecurity, or None for PLAINTEXT
        self.names = names or SettingNames()
        self._answered = False  # some response came on this connection
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[int, tuple[asyncio.Future, int, int]] = {}
        self._ids = itertools.count(1)
        self._read_task: asyncio.Task | None = None
        self._lock = asyncio.Lock()

    @property
    def connected(self) -> bool:
        return self._writer is not None and not self._writer.is_closing()

    async def connect(self, timeout: float) -> None:
        host, port = self.address.rsplit(":", 1)
        sec = self.security
        try:
            if sec is None or sec.protocol == "PLAINTEXT":
                self._reader, self._writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), timeout)
            else:
                self._reader, self._writer = await asyncio.wait_for(self._secure_connect(host, int(port)), timeout)
        except HandshakeFailed:
            self.close()
            raise
        except (OSError, asyncio.TimeoutError) as e:
            self.close()
            raise ConnectionFailed(f"{self.address}: {os_reason(e)}") from None
        except PidQuorumError:
            self.close()  # SASL refused us: not retriable, the caller sees why
            raise
        self._answered = False
        self._read_task = asyncio.get_running_loop().create_task(self._read_loop())

    async def _secure_connect(self, host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        ctx = self.security.ssl_context()
        try:
            reader, writer = await asyncio.open_connection(host, port, ssl=ctx,
                                                           server_hostname=host if ctx else None)
        except ssl.SSLCertVerificationError as e:
            raise HandshakeFailed(self._verify_failed(e, host)) from None
        except (ssl.SSLEOFError, ssl.SSLZeroReturnError, ConnectionResetError, asyncio.IncompleteReadError):
            if ctx is None:
                raise
            if await _speaks_plaintext(host, port, TLS_PROBE_TIMEOUT_S):  # asked, so that only the truth is said
                raise HandshakeFailed(f"{self.address}: closed the connection during the TLS handshake: it is a "
                                      f"port without TLS ({self.names.plaintext})") from None
            raise ConnectionFailed(f"{self.address}: closed the connection during the TLS handshake") from None
        except ssl.SSLError as e:
            if isinstance(e, ssl.SSLSyscallError):
                raise
            if e.reason == "WRONG_VERSION_NUMBER":  # the node answered with bytes that are not TLS
                raise HandshakeFailed(f"{self.address}: answered without TLS: it is a port without TLS "
                                      f"({self.names.plaintext})") from None
            raise HandshakeFailed(f"{self.address}: TLS handshake failed ({e.reason or e})") from None
        self._writer = writer
        if self.security.sasl:
            try:
                await authenticate(reader, writer, self.security, self.client_id, self.address)
            except kafka.FrameError as e:
                raise ConnectionError(f"SASL: {e}") from None
        return reader, writer

    def _verify_failed(self, e: ssl.SSLCertVerificationError, host: str) -> str:
        why = f"{self.address}: TLS certificate verify failed ({(e.verify_message or str(e)).rstrip('.')})"
        if e.verify_code in _UNTRUSTED:
            return f"{why}: pass {self.names.cafile} with the CA that signed the quorum's certificates"
        if e.verify_code in _NAME_MISMATCH:
            return f"{why}: the node's certificate must name {host} in its subjectAltName, or dial a name it has"
        if e.verify_code in _EXPIRED:
            return f"{why}: the node's certificate must be renewed"
        return why

    def _closed(self, partial: bytes) -> Exception:
        """The connection ended while an answer was read (``partial``: the bytes of it that came)."""
        if not self._answered and not self._tls and _looks_like_tls(partial):
            return HandshakeFailed(f"{self.address}: answered in TLS: it is a TLS port ({self.names.tls})")
        return ConnectionFailed(f"{self.address}: closed the connection before answering")

    @property
    def _tls(self) -> bool:
        return self.security is not None and self.security.tls

    async def _read_loop(self) -> None:
        assert self._reader is not None
        error: Exception = ConnectionFailed(f"{self.address}: connection closed")
        try:
            while True:
                head = await self._reader.readexactly(4)
                if not self._answered and not self._tls and _looks_like_tls(head):
                    raise asyncio.IncompleteReadError(head, None)
                size = kafka.SIZE.unpack(head)[0]
                frame = await self._reader.readexactly(size)
                self._answered = True
                corr = kafka.SIZE.unpack_from(frame, 0)[0]
                entry = self._pending.pop(corr, None)
                if entry is None:
                    continue
                fut, api_key, version = entry
                if not fut.done():
                    try:
                        fut.set_result(api.QUORUM_API.parse_response(frame, api_key, version)[1])
                    except Exception as e:  # noqa: BLE001 - hand any decode failure to the caller
                        fut.set_exception(ConnectionFailed(f"{self.address}: bad response: {e}"))
        except asyncio.IncompleteReadError as e:
            error = self._closed(e.partial)
            if not self._tls and not e.partial and not self._answered and self._pending:
                # Closed without a byte: a TLS port does that to a request that is no ClientHello.  Asked with
                # a handshake, so that the error says so only when it is true (and then no later try is made).
                host, port = self.address.rsplit(":", 1)
                if await _speaks_tls(host, int(port), TLS_PROBE_TIMEOUT_S):
                    error = HandshakeFailed(f"{self.address}: closed the connection without an answer: it is a "
                                            f"TLS port ({self.names.tls})")
        except OSError as e:
            error = ConnectionFailed(f"{self.address}: {os_reason(e)}")
        finally:
            self.close()
            for fut, _, _ in self._pending.values():
                if not fut.done():
                    fut.set_exception(error)
            self._pending.clear()

    async def call(self, body: Any, timeout: float) -> Any:
        """Send a kio request entity (or a dict for DescribeState) and wait for its response body."""
        if not self.connected:
            async with self._lock:
                if not self.connected:
                    await self.connect(timeout)
        assert self._writer is not None
        corr = next(self._ids) & 0x7FFFFFFF
        if not hasattr(body, "__api_key__"):  # a pidquorum msgpack API
            frame, api_key, version = api.encode_admin_request(body, corr, self.client_id), api.msgpack_api_of(body), 0
        else:
            frame, api_key, version = kafka.encode_request(body, corr, self.client_id), body.__api_key__, body.__version__
        fut = asyncio.get_running_loop().create_future()
        self._pending[corr] = (fut, api_key, version)
        try:
            self._writer.write(frame)
            await self._writer.drain()
            return await result_within(fut, timeout)
        except (OSError, ConnectionError) as e:
            raise ConnectionFailed(f"{self.address}: {os_reason(e)}") from None
        except asyncio.TimeoutError:
            raise RequestTimedOutError(f"{self.address}: no response within {timeout:.2f}s") from None
        finally:
            self._pending.pop(corr, None)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._writer = None
        task, self._read_task = self._read_task, None
        if task is not None and task is not _current_task():
            task.cancel()  # its reader ends with the connection; not left pending when the loop closes
