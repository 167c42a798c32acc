"""A Kafka listener's connection layer, shared by the quorum's client port and the broker.

``KafkaListener`` takes a connection from its accept to its close: the connection limits, TLS started
on the accepted socket, the SASL gate and its deadline before authentication (``quorum.security.limits``),
the frame's parse with its bad-input accounting, and the clean-up that frees the connection's buffers at
once.  A server says how it reads and answers a connection's frames (``serve``): the quorum handles
requests concurrently and answers them in order, the broker one at a time as Kafka does.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from quorum.security.limits import BeforeAuthentication, ConnectionLimits, TrimAfterClose
from quorum.telemetry.logs import FirstOfEach, Throttled
from records.wire import kafka


@dataclass
class Accepted:
    """One accepted connection: its streams, its peer, its SASL session (None: SASL off) and the gate
    that holds it to its authentication deadline."""
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    peer: Any
    session: Any
    gate: BeforeAuthentication

    @property
    def principal(self) -> str | None:
        return self.session.principal if self.session is not None else None


class KafkaListener:
    """Set by the server before it accepts: ``cfg`` (max_frame_bytes, max_connections,
    max_connections_per_ip, authentication_timeout_ms, tls_handshake_timeout_ms), ``sasl`` (None: off),
    ``ssl`` (None: PLAINTEXT), ``api`` (the ``kafka.ApiTable`` it parses with), ``counters``,
    ``unauthenticated_frame_bytes``; ``listen(log)`` sets the rest."""

    cfg: Any
    sasl: Any
    ssl: Any
    api: kafka.ApiTable
    counters: dict[str, int]
    unauthenticated_frame_bytes: int

    def listen(self, log: logging.Logger) -> None:
        self.log = log
        self.limits = ConnectionLimits(self.cfg.max_connections, self.cfg.max_connections_per_ip, self.counters, log)
        self._peer_log = Throttled(log, 10.0)  # what unauthenticated peers cause: at most a line every 10 s
        self._trim = TrimAfterClose(log)  # else 100 connections that each parked 1 MiB leave the process at its peak
        self._frame_log = FirstOfEach(log)  # unknown API keys, unsupported versions: once each

    async def serve(self, conn: Accepted) -> None:
        """Read, handle and answer ``conn``'s frames until the stream ends or a bad frame closes it; what
        it must do before the socket closes is done before it returns."""
        raise NotImplementedError

    async def accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """``asyncio.start_server``'s callback.  The limits and deadlines count from the accept, not from the
        end of a TLS handshake a peer can drag out."""
        peer = writer.get_extra_info("peername")
        if not self.limits.admit(peer):
            writer.transport.abort()  # nothing is read or answered: the client sees a reset
            return
        session = self.sasl.session(peer) if self.sasl is not None else None
        gate = BeforeAuthentication(writer, session, peer, self.cfg.authentication_timeout_ms, self.counters,
                                    self._peer_log)
        conn = Accepted(reader, writer, peer, session, gate)
        try:
            if self.ssl is not None and not await gate.start_tls(self.ssl, self.cfg.tls_handshake_timeout_ms):
                return
            await self.serve(conn)
        except (ConnectionError, OSError) as e:
            if not gate.expired:
                self.log.info("client %s: %s", peer, e)
        except asyncio.CancelledError:
            pass  # shutting down: end quietly (not a logged task failure)
        finally:
            gate.cancel()
            writer.close()
            # The reader keeps the exception that ended the stream (a reset), and the exception keeps the
            # frames it was raised through, which keep the reader: a cycle only the garbage collector would
            # free, with the connection's buffers in it.  Cut, they are freed now.
            error = reader.exception()
            if error is not None:
                error.__traceback__ = None
            self.limits.release(peer)
            self._trim.soon()  # a second later the heap's free pages go back to the system (glibc)

    def parse(self, frame: bytes, peer: Any) -> kafka.Request | bytes:
        """``frame``'s request, or the error answer to a readable header with a bad body (INVALID_REQUEST,
        UNSUPPORTED_VERSION ...).  An unreadable frame raises ``kafka.FrameError``: the connection closes."""
        try:
            return self.api.parse(frame)
        except kafka.FrameError as e:
            self.counters[e.counter] += 1
            if e.kind is None:
                self.log.warning("client %s: %s; closing", peer, e)
            else:
                self._frame_log(e.kind, logging.WARNING, "client %s: %s; closing the connection", peer, e)
            raise
        except kafka.BadRequest as e:
            self.counters["bad_requests"] += 1
            if e.kind is None:
                self.log.warning("client %s: %s (answered %s)", peer, e.message, e.code.name)
            else:  # a newer ApiVersions: how every negotiating client starts (KIP-511), so once per version
                self._frame_log(e.kind, logging.INFO, "client %s: %s (answered %s)", peer, e.message, e.code.name)
            return self.api.error_response(e)


__all__ = ["Accepted", "KafkaListener"]
